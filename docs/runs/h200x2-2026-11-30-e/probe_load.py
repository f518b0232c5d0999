"""Scratch probe: sprite.runtime.dcp_read against torch's dcp.load and a plain per-rank torch.load; where DCP's
save spends its time (cProfile, rank 0)."""
import cProfile, inspect, os, pathlib, pstats, statistics, sys, time
sys.path.insert(0, os.path.join(os.environ["REPO"], "benchmarks"))
import checkpoint_io as ci
import torch, torch.distributed as dist, torch.distributed.checkpoint as dcp
from sprite.runtime.hashed_save import dcp_save
from sprite.runtime import dcp_read
acc = os.environ.get("ACC", "cuda")
n = {"fast": 0, "slow": 0}
orig_t, orig_s = dcp_read._stored, dcp_read.Reader._as_torch
def t(*a):
    r = orig_t(*a); n["fast"] += 1; return r
def s(*a):
    n["slow"] += 1; return orig_s(*a)
dcp_read._stored = t; dcp_read.Reader._as_torch = s
model, opt, gm, go = ci._state(os.environ.get("M", "qwen2.5-0.5b-shape"), acc)
rank = dist.get_rank()
if rank == 0:
    from torch.distributed.checkpoint import FileSystemReader
    print("has transforms:", "transforms" in inspect.getsource(FileSystemReader), "get_record_size:",
          hasattr(torch._C.PyTorchFileReader, "get_record_size"))
state = {"model": gm(model), "optim": go(model, opt)}
root = pathlib.Path(os.environ["PROBE_TMP"])
local = {k: (v.to_local() if hasattr(v, "to_local") else v) for k, v in state["model"].items()}
def timed(f):
    dist.barrier(); t0 = time.perf_counter(); f(); dist.barrier(); return time.perf_counter() - t0
T = {"plain_save": [], "sprite_save": []}
for i in range(3):
    folder = root / f"dcp{i}"
    if rank == 0: folder.mkdir()
    T["plain_save"].append(timed(lambda: torch.save(local, root / f"p{i}_{rank}.pt")))
    os.sync()
    T["sprite_save"].append(timed(lambda: dcp_save(state, folder)))
    os.sync()
folder = root / "dcp0"
ref = {k: v.full_tensor().clone() if hasattr(v, "full_tensor") else v for k, v in state["model"].items()}
T.update({"plain_load": [], "torch_load": [], "reader_dist": [], "sprite_load": []})
for i in range(4):
    T["plain_load"].append(timed(lambda: ci._into(local, torch.load(root / f"p0_{rank}.pt", weights_only=True))))
    T["torch_load"].append(timed(lambda: dcp.load(state, checkpoint_id=folder)))
    T["reader_dist"].append(timed(lambda: dcp.load(state, storage_reader=dcp_read.Reader(folder))))
    T["sprite_load"].append(timed(lambda: dcp_read.load(state, folder)))
if rank == 0:
    print("medians", {k: round(statistics.median(v), 3) for k, v in T.items()}, n)
for v in state["model"].values():
    (v.to_local() if hasattr(v, "to_local") else v).zero_()
dcp_read.load(state, folder)
bad = [k for k, v in state["model"].items() if not torch.equal(v.full_tensor() if hasattr(v, "full_tensor") else v, ref[k])]
print(rank, "mismatch after sprite load:", len(bad))
for name, fn in (("sprite_save", lambda: dcp_save(state, root / "prof")), ("plain_save", lambda: torch.save(local, root / f"prof{rank}.pt")),
                 ("sprite_load", lambda: dcp_read.load(state, folder))):
    if rank == 0 and name == "sprite_save": (root / "prof").mkdir()
    dist.barrier(); os.sync(); dist.barrier()
    pr = cProfile.Profile(); pr.enable(); fn(); pr.disable()
    if rank == 0:
        print("=== profile", name); st = pstats.Stats(pr); st.sort_stats("tottime").print_stats(14); st.print_callers("builtins.max")
if rank == 0:
    print("medians", {k: round(statistics.median(v), 3) for k, v in T.items()}, n)
dist.destroy_process_group()
