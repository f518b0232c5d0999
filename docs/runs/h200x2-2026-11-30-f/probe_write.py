"""Scratch probe: where sprite's sharded save (sprite.runtime.dcp_write) spends its time on a 2-H200 host, against
a plain per-rank torch.save of the same local shards (each save after os.sync, medians of 5)."""
import os, pathlib, statistics, sys, time, collections
sys.path.insert(0, os.path.join(os.environ["REPO"], "benchmarks"))
import checkpoint_io as ci
import torch, torch.distributed as dist
from sprite.runtime import dcp_write, hashed_save
from sprite import digest
clock = collections.defaultdict(float)
def timed_method(owner, name, key):
    static = isinstance(getattr(owner, "__dict__", {}).get(name), staticmethod)
    real = getattr(owner, name)
    def wrapper(*a, **k):
        t = time.perf_counter()
        try:
            return real(*a, **k)
        finally:
            clock[key] += time.perf_counter() - t
    setattr(owner, name, staticmethod(wrapper) if static else wrapper)
timed_method(dcp_write.Writer, "write_data", "write_data")
timed_method(dcp_write.Writer, "_host", "host")
timed_method(dcp_write._Sink, "put", "put(thread)")
timed_method(digest.Growing, "entry", "hash_tail")
timed_method(dcp_write, "_Format", "format")
import logging
from torch.distributed.checkpoint import logger as dcp_logger_module, save
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from sprite.runtime.collective import paused_gc
phases = collections.defaultdict(float)
class Grab(logging.Handler):
    def emit(self, record):
        msg = record.msg if isinstance(record.msg, dict) else {}
        if msg.get("event") == "end" and "times_spent" in msg:
            phases[msg["func_name"]] += msg["times_spent"] / 1e9
log = dcp_logger_module._dcp_logger
log.setLevel(logging.DEBUG); log.addHandler(Grab())
def cached(folder):
    with paused_gc():
        save(state, storage_writer=dcp_write.Writer(folder), planner=DefaultSavePlanner(enable_plan_caching=True))
model, opt, gm, go = ci._state(os.environ.get("M", "qwen2.5-0.5b-shape"), os.environ.get("ACC", "cuda"))
rank, world = dist.get_rank(), dist.get_world_size()
state = {"model": gm(model), "optim": go(model, opt)}
root = pathlib.Path(os.environ["PROBE_TMP"])
local = {key: {k: (v.to_local() if hasattr(v, "to_local") else v) for k, v in part.items()}
         for key, part in (("model", state["model"]), ("optim", ci._flat(state["optim"])))}
def timed(f):
    os.sync(); dist.barrier(); t0 = time.perf_counter(); f(); dist.barrier(); return time.perf_counter() - t0
rows = collections.defaultdict(list)
nohash = os.environ.get("NOHASH")
for i in range(5):
    folder = root / f"dcp{i}"
    if rank == 0: folder.mkdir()
    rows["plain"].append(timed(lambda: torch.save(local, root / f"p{i}_{rank}.pt")))
    clock.clear(); phases.clear()
    rows["dcp_save"].append(timed(lambda: hashed_save.dcp_save(state, folder)))
    for k, v in clock.items(): rows[k].append(v)
    for k, v in phases.items(): rows["phase " + k].append(v)
    f3 = root / f"cached{i}"
    if rank == 0: f3.mkdir()
    phases.clear()
    rows["cached"].append(timed(lambda: cached(f3)))
    for k, v in phases.items(): rows["cached " + k].append(v)
    dist.barrier(); t0 = time.perf_counter(); ci._seal(folder, rank, world); dist.barrier()
    rows["seal"].append(time.perf_counter() - t0)
    rows["durable"].append(ci._timed(ci._durable))
for r in range(world):
    if r == rank:
        print(f"rank {rank}", {k: round(statistics.median(v), 3) for k, v in rows.items()}, flush=True)
    dist.barrier()
dist.destroy_process_group()
