"""Scratch probe (2026-11-30): how long Python's cycle collector runs inside a sharded save and load of the
qwen2.5-0.5b-shape state on CPU (gc.callbacks). Output: probe_gc.txt."""
import os, sys, time, pathlib, gc
sys.path.insert(0, "/work/main/benchmarks")
import checkpoint_io as ci
import torch, torch.distributed as dist, torch.distributed.checkpoint as dcp
from sprite.runtime.hashed_save import dcp_save
from sprite.runtime import dcp_read
model, opt, gm, go = ci._state(os.environ.get("M","qwen2.5-0.5b-shape"), "cpu")
rank = dist.get_rank()
state = {"model": gm(model), "optim": go(model, opt)}
root = pathlib.Path(os.environ["OUT"])
log = []
t0 = [0]
def cb(phase, info):
    if phase == "start": t0[0] = time.perf_counter()
    else: log.append((info["generation"], time.perf_counter() - t0[0]))
gc.callbacks.append(cb)
print(rank, "objects tracked", len(gc.get_objects()), gc.get_threshold(), gc.get_count())
for i in range(2):
    folder = root / f"dcp{i}"
    if rank == 0: folder.mkdir(exist_ok=True)
    dist.barrier(); log.clear()
    t = time.perf_counter(); dcp_save(state, folder); s = time.perf_counter() - t
    print(rank, f"save {s:.3f} gc", [(g, round(d, 3)) for g, d in log if d > 0.005], len(log), round(sum(d for _, d in log), 3))
    dist.barrier(); log.clear()
    t = time.perf_counter(); dcp_read.load(state, folder); s = time.perf_counter() - t
    print(rank, f"load {s:.3f} gc", [(g, round(d, 3)) for g, d in log if d > 0.005], len(log), round(sum(d for _, d in log), 3))
dist.destroy_process_group()
