"""Scratch probe: sprite's sharded save with and without torch's save-plan caching (DefaultSavePlanner
enable_plan_caching), each after os.sync, interleaved, medians of 5 (the first save of each fills the cache), with
the phase times torch's own dcp logger reports on rank 0."""
import inspect, logging, os, pathlib, statistics, sys, time
sys.path.insert(0, os.path.join(os.environ["REPO"], "benchmarks"))
import checkpoint_io as ci
import torch, torch.distributed as dist
from torch.distributed.checkpoint import FileSystemWriter, save
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint import logger as dcp_logger_module
from sprite.runtime.hashed_save import dcp_save
from sprite.runtime.collective import paused_gc
phases = {}
class Grab(logging.Handler):
    def emit(self, record):
        msg = record.msg if isinstance(record.msg, dict) else {}
        if msg.get("event") == "end" and "times_spent" in msg:
            phases.setdefault(msg["func_name"], []).append(msg["times_spent"] / 1e9)
log = dcp_logger_module._dcp_logger
log.setLevel(logging.DEBUG); log.addHandler(Grab())
model, opt, gm, go = ci._state(os.environ.get("M", "qwen2.5-0.5b-shape"), os.environ.get("ACC", "cuda"))
rank = dist.get_rank()
if rank == 0:
    print("DefaultSavePlanner", inspect.signature(DefaultSavePlanner.__init__), flush=True)
state = {"model": gm(model), "optim": go(model, opt)}
root = pathlib.Path(os.environ["PROBE_TMP"])
local = {key: {k: (v.to_local() if hasattr(v, "to_local") else v) for k, v in part.items()}
         for key, part in (("model", state["model"]), ("optim", ci._flat(state["optim"])))}
def cached(folder):
    with paused_gc():
        save(state, storage_writer=FileSystemWriter(folder, sync_files=False, thread_count=1),
             planner=DefaultSavePlanner(enable_plan_caching=True))
def timed(f):
    os.sync(); dist.barrier(); t0 = time.perf_counter(); f(); dist.barrier(); return time.perf_counter() - t0
rows = {"plain": [], "sprite": [], "cached": []}
split = {"sprite": {}, "cached": {}}
for i in range(5):
    for name, fn in (("sprite", dcp_save), ("cached", cached)):
        folder = root / f"{name}{i}"
        if rank == 0: folder.mkdir()
        phases.clear()
        rows[name].append(timed(lambda: fn(state, folder) if name == "sprite" else fn(folder)))
        for k, v in phases.items(): split[name].setdefault(k, []).append(sum(v))
    rows["plain"].append(timed(lambda: torch.save(local, root / f"p{i}_{rank}.pt")))
if rank == 0:
    print("save", {k: round(statistics.median(v), 3) for k, v in rows.items()}, flush=True)
    for name, d in split.items():
        print(name, {k: round(statistics.median(v), 3) for k, v in d.items()}, flush=True)
# the cached saves load back equal to the uncached ones
import torch.distributed.checkpoint as dcp
from sprite.runtime import dcp_read
ref = {k: v.full_tensor().clone() if hasattr(v, "full_tensor") else v for k, v in state["model"].items()}
for v in state["model"].values(): (v.to_local() if hasattr(v, "to_local") else v).zero_()
dcp_read.load(state, root / "cached4")
bad = [k for k, v in state["model"].items() if not torch.equal(v.full_tensor() if hasattr(v, "full_tensor") else v, ref[k])]
print(rank, "mismatch after loading the last cached save:", len(bad), flush=True)
dist.destroy_process_group()
