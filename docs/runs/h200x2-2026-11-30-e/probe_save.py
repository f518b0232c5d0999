"""Scratch probe: where sprite's sharded save spends its time on this host (each save after os.sync, medians of 5,
interleaved with a plain per-rank torch.save of the same local shards)."""
import os, pathlib, statistics, sys, time
sys.path.insert(0, os.path.join(os.environ["REPO"], "benchmarks"))
import checkpoint_io as ci
import torch, torch.distributed as dist
from torch.distributed.checkpoint import FileSystemWriter
from sprite.runtime.hashed_save import dcp_save
from sprite.runtime import durable
clock = {"write_data": 0.0, "finish": 0.0}
wd, fin = FileSystemWriter.write_data, FileSystemWriter.finish
def t_wd(*a):
    t = time.perf_counter(); r = wd(*a); r.wait(); clock["write_data"] += time.perf_counter() - t; return r
def t_fin(*a, **k):
    t = time.perf_counter(); r = fin(*a, **k); clock["finish"] += time.perf_counter() - t; return r
FileSystemWriter.write_data, FileSystemWriter.finish = t_wd, t_fin
model, opt, gm, go = ci._state(os.environ.get("M", "qwen2.5-0.5b-shape"), os.environ.get("ACC", "cuda"))
rank, world = dist.get_rank(), dist.get_world_size()
state = {"model": gm(model), "optim": go(model, opt)}
root = pathlib.Path(os.environ["PROBE_TMP"])
local = {key: {k: (v.to_local() if hasattr(v, "to_local") else v) for k, v in part.items()}
         for key, part in (("model", state["model"]), ("optim", ci._flat(state["optim"])))}
def timed(f):
    os.sync(); dist.barrier(); t0 = time.perf_counter(); f(); dist.barrier(); return time.perf_counter() - t0
rows = {k: [] for k in ("plain", "dcp_save", "write_data", "finish", "seal", "durable")}
for i in range(5):
    folder = root / f"dcp{i}"
    if rank == 0: folder.mkdir()
    rows["plain"].append(timed(lambda: torch.save(local, root / f"p{i}_{rank}.pt")))
    clock.update(write_data=0.0, finish=0.0)
    rows["dcp_save"].append(timed(lambda: dcp_save(state, folder)))
    rows["write_data"].append(clock["write_data"]); rows["finish"].append(clock["finish"])
    dist.barrier(); t0 = time.perf_counter(); ci._seal(folder, rank, world); dist.barrier()
    rows["seal"].append(time.perf_counter() - t0)
    rows["durable"].append(ci._timed(ci._durable))
if rank == 0:
    print("save", {k: round(statistics.median(v), 3) for k, v in rows.items()}, flush=True)
dist.destroy_process_group()
