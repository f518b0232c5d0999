"""Scratch probe: where the time of a verified checkpoint save/load goes on this host's disk (not a benchmark)."""
import hashlib, io, os, statistics, sys, tempfile, time, pathlib
from concurrent.futures import ThreadPoolExecutor
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemWriter, FileSystemReader
from sprite import digest

CH = 64 << 20
def state():
    g = torch.Generator().manual_seed(0)
    d = {"embed": torch.randn(151936, 896, generator=g)}
    for i in range(24):
        for n, s in {"q": (896, 896), "k": (128, 896), "v": (128, 896), "o": (896, 896), "gate": (4864, 896), "up": (4864, 896), "down": (896, 4864)}.items():
            d[f"l{i}.{n}"] = torch.randn(*s, generator=g)
    return d

def drop(p):
    p = pathlib.Path(p)
    for name in [p] if p.is_file() else [q for q in p.rglob("*") if q.is_file()]:
        fd = os.open(name, os.O_RDONLY); os.fsync(fd); os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED); os.close(fd)

def t(fn):
    s = time.perf_counter(); r = fn(); return time.perf_counter() - s, r

def hash_fd(fd, workers):
    size = os.fstat(fd).st_size
    jobs = [(s, min(CH, size - s)) for s in range(0, size, CH)]
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(lambda j: digest._hash_range(fd, *j), jobs))

def single_read(path, workers):
    fd = os.open(path, os.O_RDONLY)
    size = os.fstat(fd).st_size
    buf = bytearray(size); mv = memoryview(buf)
    def piece(j):
        s, n = j; h = hashlib.sha256(); done = 0
        while done < n:
            k = os.preadv(fd, [mv[s + done:s + min(n, done + (8 << 20))]], s + done)
            h.update(mv[s + done:s + done + k]); done += k
        return h.hexdigest()
    with ThreadPoolExecutor(workers) as pool:
        dig = list(pool.map(piece, [(s, min(CH, size - s)) for s in range(0, size, CH)]))
    os.close(fd)
    return torch.load(io.BytesIO(mv), weights_only=True), dig

def main():
    root = pathlib.Path(tempfile.mkdtemp(dir=os.environ.get("PROBE_TMP")))
    sd = state(); print("state bytes", sum(v.numel() * 4 for v in sd.values()) / 1e9, "GB, cores", len(os.sched_getaffinity(0)), flush=True)
    rows = {}
    def add(k, v): rows.setdefault(k, []).append(v)
    for r in range(3):
        a, b, c = root / f"a{r}", root / f"b{r}", root / f"c{r}"
        add("plain_save", t(lambda: torch.save(sd, a))[0])
        add("plain_fsync", t(lambda: (lambda fd: (os.fsync(fd), os.close(fd)))(os.open(a, os.O_RDONLY)))[0])
        def save_hash(w):
            fd = os.open(b, os.O_RDWR | os.O_CREAT | os.O_EXCL)
            with os.fdopen(os.dup(fd), "wb") as f: torch.save(sd, f)
            hash_fd(fd, w); os.close(fd)
        add("save_hash8", t(lambda: save_hash(8))[0])
        # small fsync right after an unsynced big write
        def small():
            fd = os.open(root / f"m{r}", os.O_WRONLY | os.O_CREAT | os.O_EXCL); os.write(fd, b"x" * 2000); os.fsync(fd); os.close(fd)
            dfd = os.open(root, os.O_RDONLY); os.fsync(dfd); os.close(dfd)
        add("small_fsync_after_big", t(small)[0])
        add("big_fsync_after", t(lambda: (lambda fd: (os.fsync(fd), os.close(fd)))(os.open(b, os.O_RDONLY)))[0])
        os.replace(b, c)
        # rename-over-existing then small fsync
        torch.save(sd, root / f"d{r}")
        os.replace(root / f"d{r}", c)
        add("small_fsync_after_replace", t(small if False else (lambda: (lambda fd: (os.write(fd, b"y"), os.fsync(fd), os.close(fd)))(os.open(root / f"n{r}", os.O_WRONLY | os.O_CREAT | os.O_EXCL))))[0])
        for tc, sync in ((1, True), (1, False), (4, False), (8, False), (4, True)):
            dd = root / f"dcp{r}_{tc}_{sync}"
            add(f"dcp_save_t{tc}_sync{sync}", t(lambda: dcp.save(sd, storage_writer=FileSystemWriter(dd, sync_files=sync, thread_count=tc)))[0])
        # loads (warm), file a
        add("load_plain", t(lambda: torch.load(a, weights_only=True))[0])
        dest = {k: torch.empty_like(v) for k, v in sd.items()}
        def plain_copy():
            got = torch.load(a, weights_only=True)
            for k, v in got.items(): dest[k].copy_(v)
        add("loadc_plain_copy", t(plain_copy)[0])
        def mmap_copy():
            got = torch.load(a, weights_only=True, mmap=True)
            for k, v in got.items(): dest[k].copy_(v)
        add("loadc_mmap_copy", t(mmap_copy)[0])
        for w in (8, 16, 32):
            def verify_then_load():
                fd = os.open(a, os.O_RDONLY); hash_fd(fd, w); os.close(fd); torch.load(a, weights_only=True)
            add(f"load_verify_then_load{w}", t(verify_then_load)[0])
            def verify_then_mmap_copy():
                fd = os.open(a, os.O_RDONLY); hash_fd(fd, w); os.close(fd)
                got = torch.load(a, weights_only=True, mmap=True)
                for k, v in got.items(): dest[k].copy_(v)
            add(f"loadc_verify_mmap_copy{w}", t(verify_then_mmap_copy)[0])
        add("load_mmap", t(lambda: torch.load(a, weights_only=True, mmap=True))[0])
        dd = root / f"dcp{r}_8_False"
        tgt = {k: torch.empty_like(v) for k, v in sd.items()}
        add("dcp_load", t(lambda: dcp.load(tgt, storage_reader=FileSystemReader(dd)))[0])
        # cold
        drop(a); add("cold_load_plain", t(lambda: torch.load(a, weights_only=True))[0])
        drop(a); add("cold_verify_then_load8", t(lambda: (hash_fd(os.open(a, os.O_RDONLY), 8), torch.load(a, weights_only=True)))[0])
        drop(a); add("cold_verify_then_load16", t(lambda: (hash_fd(os.open(a, os.O_RDONLY), 16), torch.load(a, weights_only=True)))[0])
        drop(a); add("coldc_plain_copy", t(plain_copy)[0])
        drop(a); add("coldc_verify_mmap_copy16", t(lambda: (hash_fd(os.open(a, os.O_RDONLY), 16), [dest[k].copy_(v) for k, v in torch.load(a, weights_only=True, mmap=True).items()]))[0])
        drop(dd); add("cold_dcp_load", t(lambda: dcp.load(tgt, storage_reader=FileSystemReader(dd)))[0])
        for p in root.iterdir():
            if p.is_file(): p.unlink()
            else:
                import shutil; shutil.rmtree(p)
        print("repeat", r, "done", flush=True)
    base = statistics.median(rows["plain_save"]); lb = statistics.median(rows["load_plain"]); cb = statistics.median(rows["cold_load_plain"])
    for k, v in rows.items():
        m = statistics.median(v)
        ref = (statistics.median(rows["coldc_plain_copy"]) if k.startswith("coldc") else cb if k.startswith("cold") else
               statistics.median(rows["loadc_plain_copy"]) if k.startswith("loadc") else lb if k.startswith("load") or k == "dcp_load" else base)
        print(f"{k:32s} {m:7.3f} s  ratio {m / ref:5.2f}   all {['%.2f' % x for x in v]}")
main()
