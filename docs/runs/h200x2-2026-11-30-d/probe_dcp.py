"""Scratch probe (torchrun, 2 ranks): where a sealed sharded save and a verified sharded load spend their time,
and two alternatives: staging the state to CPU and writing it on 4 threads; reading each rank's own shard file
into memory while hashing it, then dcp.load from that memory (not a benchmark)."""
import contextlib, hashlib, io, os, statistics, sys, pathlib, tempfile, time
from concurrent.futures import ThreadPoolExecutor
sys.path.insert(0, os.path.join(os.environ["REPO"], "benchmarks"))
import torch, torch.distributed as dist, torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.filesystem import FileSystem
from torch.distributed.tensor import DTensor
import checkpoint_io as B
from sprite import digest
from sprite.runtime.hashed_save import dcp_save

class MemoryStream(io.RawIOBase):
    def __init__(self, view): self.view, self.pos = view, 0
    def readable(self): return True
    def seekable(self): return True
    def tell(self): return self.pos
    def seek(self, off, whence=0):
        self.pos = off if whence == 0 else self.pos + off if whence == 1 else len(self.view) + off
        return self.pos
    def readinto(self, b):
        n = min(len(b), len(self.view) - self.pos); b[:n] = self.view[self.pos:self.pos + n]; self.pos += n; return n

class MemFS(FileSystem):
    def __init__(self, cache): super().__init__(); self.cache = cache
    @contextlib.contextmanager
    def create_stream(self, path, mode):
        view = self.cache.get(os.fspath(path))
        if view is None:
            with super().create_stream(path, mode) as s: yield s
        else:
            yield io.BufferedReader(MemoryStream(view), buffer_size=1 << 20)

def read_hashed(path):
    fd = os.open(path, os.O_RDONLY); size = os.fstat(fd).st_size
    buf = bytearray(size); mv = memoryview(buf)
    def piece(job):
        s, n = job; h = hashlib.sha256(); done = 0
        while done < n:
            k = os.preadv(fd, [mv[s + done:s + n]], s + done); h.update(mv[s + done:s + done + k]); done += k
        return h.hexdigest()
    with ThreadPoolExecutor(digest.workers()) as pool:
        d = list(pool.map(piece, digest._pieces(size)))
    os.close(fd); return mv, d

def stage(state):
    def cpu(v):
        if isinstance(v, DTensor):
            return DTensor.from_local(v.to_local().to("cpu"), v.device_mesh, v.placements, run_check=False)
        if isinstance(v, torch.Tensor): return v.to("cpu")
        if isinstance(v, dict): return {k: cpu(x) for k, x in v.items()}
        if isinstance(v, list): return [cpu(x) for x in v]
        return v
    return cpu(state)

def main():
    model, opt, gm, go = B._state(os.environ.get("MODEL", "qwen2.5-0.5b-shape"), os.environ.get("ACC", "cuda"))
    rank = dist.get_rank(); world = dist.get_world_size()
    state = {"model": gm(model), "optim": go(model, opt)}
    local = {k: {n: (v.to_local() if hasattr(v, "to_local") else v) for n, v in part.items()}
             for k, part in (("model", state["model"]), ("optim", B._flat(state["optim"])))}
    root = pathlib.Path(os.environ["PROBE_TMP"]) if rank == 0 else None
    root = pathlib.Path(B._timed.__globals__["os"].environ["PROBE_TMP"])
    rows = {}
    def add(k, v): rows.setdefault(k, []).append(v)
    for r in range(3):
        plain, f1, f4 = root / f"plain{r}", root / f"t1_{r}", root / f"st4_{r}"
        if rank == 0: plain.mkdir(); f1.mkdir(); f4.mkdir()
        dist.barrier()
        add("plain_save", B._timed(lambda: torch.save(local, plain / f"rank{rank}.pt"), clean=True))
        add("dcp_save_t1_nosync", B._timed(lambda: dcp_save(state, f1), clean=True))
        add("hash_own", B._timed(lambda: B.__dict__["_describe_mine"] if False else __import__("sprite.runtime.ckpt_seal", fromlist=["x"])._describe_mine(f1, rank, world, sync=False)))
        box = {}
        add("stage_cpu", B._timed(lambda: box.update(s=stage(state)), clean=True))
        try:
            add("dcp_save_cpu_t4_nosync", B._timed(lambda: dcp.save(box["s"], storage_writer=FileSystemWriter(f4, sync_files=False, thread_count=4))))
        except Exception as e:
            print("stage write failed", type(e).__name__, str(e)[:300], flush=True); break
        add("plain_load_copy", B._timed(lambda: B._into(local, torch.load(plain / f"rank{rank}.pt", weights_only=True))))
        add("dcp_load", B._timed(lambda: dcp.load(state, checkpoint_id=f1)))
        own = sorted(str(p) for p in f1.iterdir() if p.name.startswith(f"__{rank}_"))
        def mem_load():
            cache = {p: read_hashed(p)[0] for p in own}
            reader = FileSystemReader(f1); reader.fs = MemFS(cache)
            dcp.load(state, storage_reader=reader)
        add("mem_hashed_dcp_load", B._timed(mem_load))
        add("cold_plain_load_copy", B._cold(lambda: B._into(local, torch.load(plain / f"rank{rank}.pt", weights_only=True)), plain))
        add("cold_dcp_load", B._cold(lambda: dcp.load(state, checkpoint_id=f1), f1))
        add("cold_mem_hashed_dcp_load", B._cold(mem_load, f1))
        if rank == 0: print("repeat", r, flush=True)
    if rank == 0:
        for k, v in rows.items():
            print(f"{k:28s} {statistics.median(v):6.3f} s  all {['%.2f' % x for x in v]}", flush=True)
    dist.destroy_process_group()
main()
