"""Scratch probe: the stages of sprite's single-file save on this host (not a benchmark)."""
import os, statistics, sys, tempfile, time, pathlib
import torch
sys.path.insert(0, os.path.dirname(__file__))
from probe_io import state
from sprite import digest
from sprite.runtime import hashed_save, durable

def t(fn):
    s = time.perf_counter(); fn(); return time.perf_counter() - s

root = pathlib.Path(tempfile.mkdtemp(dir=os.environ.get("PROBE_TMP")))
sd = state(); rows = {}
print("workers", digest.workers(), flush=True)
for r in range(4):
    def add(k, v): rows.setdefault(k, []).append(v)
    add("save_path", t(lambda: torch.save(sd, root / f"p{r}")))
    def fileobj():
        fd = os.open(root / f"f{r}", os.O_RDWR | os.O_CREAT | os.O_EXCL)
        with os.fdopen(os.dup(fd), "wb") as out: torch.save(sd, out)
        add("hash_after", t(lambda: digest.open_file(fd)))
        os.close(fd)
    add("save_fileobj_plus_hash", t(fileobj))
    def fileobj_unbuf():
        fd = os.open(root / f"u{r}", os.O_RDWR | os.O_CREAT | os.O_EXCL)
        with os.fdopen(os.dup(fd), "wb", buffering=0) as out: torch.save(sd, out)
        os.close(fd)
    add("save_fileobj_unbuffered", t(fileobj_unbuf))
    add("atomic_save", t(lambda: hashed_save.atomic_save(sd, root / f"a{r}")))
    add("durable_wait", t(lambda: durable.drain(600)))
    add("save_path_again", t(lambda: torch.save(sd, root / f"q{r}")))
    for p in list(root.iterdir()): p.unlink()
for k, v in rows.items():
    print(f"{k:28s} {statistics.median(v):6.3f} s  all {['%.2f' % x for x in v]}", flush=True)
