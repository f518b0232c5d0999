"""Scratch probe: where sprite.runtime.dcp_read.load spends its time on this host, for 1, 2 and 4 read threads,
against a plain per-rank torch.load + copy into the model (medians of 4, interleaved)."""
import os, pathlib, statistics, sys, time
sys.path.insert(0, os.path.join(os.environ["REPO"], "benchmarks"))
import checkpoint_io as ci
import torch, torch.distributed as dist
from sprite.runtime.hashed_save import dcp_save
from sprite.runtime import dcp_read
acc = os.environ.get("ACC", "cuda")
clock = {"one": 0.0, "read_data": 0.0}
one, read_data = dcp_read.Reader._one, dcp_read.Reader.read_data
def timed_one(*a):
    t = time.perf_counter(); r = one(*a); clock["one"] += time.perf_counter() - t; return r
def timed_read(*a):
    t = time.perf_counter(); r = read_data(*a); clock["read_data"] += time.perf_counter() - t; return r
dcp_read.Reader._one, dcp_read.Reader.read_data = timed_one, timed_read
model, opt, gm, go = ci._state(os.environ.get("M", "qwen2.5-0.5b-shape"), acc)
rank = dist.get_rank()
state = {"model": gm(model), "optim": go(model, opt)}
root = pathlib.Path(os.environ["PROBE_TMP"])
local = {k: (v.to_local() if hasattr(v, "to_local") else v) for k, v in state["model"].items()}
local.update(ci._flat(state["optim"]))
local = {k: (v.to_local() if hasattr(v, "to_local") else v) for k, v in local.items()}
folder = root / "dcp"
if rank == 0: folder.mkdir()
dist.barrier(); dcp_save(state, folder); torch.save(local, root / f"p{rank}.pt"); os.sync(); dist.barrier()
def timed(f):
    dist.barrier(); t0 = time.perf_counter(); f(); dist.barrier(); return time.perf_counter() - t0
for threads in (1, 2, 4, 2):
    dcp_read.READ_THREADS = threads
    rows = {"plain": [], "sprite": [], "read_data": [], "one": []}
    for _ in range(4):
        rows["plain"].append(timed(lambda: ci._into(local, torch.load(root / f"p{rank}.pt", weights_only=True))))
        clock.update(one=0.0, read_data=0.0)
        rows["sprite"].append(timed(lambda: dcp_read.load(state, folder)))
        rows["read_data"].append(clock["read_data"]); rows["one"].append(clock["one"])
    if rank == 0:
        print("threads", threads, {k: round(statistics.median(v), 3) for k, v in rows.items()}, flush=True)
dist.destroy_process_group()
