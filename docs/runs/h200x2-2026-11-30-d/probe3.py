"""Scratch probe: atomic_save, then the seal, then the background fsync, timed apart (not a benchmark)."""
import os, statistics, sys, tempfile, time, pathlib
import torch
from sprite import integrity
from sprite.runtime import hashed_save, durable

def state():
    g = torch.Generator().manual_seed(0)
    d = {"embed": torch.randn(151936, 896, generator=g)}
    for i in range(24):
        for n, s in {"q": (896, 896), "k": (128, 896), "v": (128, 896), "o": (896, 896), "gate": (4864, 896), "up": (4864, 896), "down": (896, 4864)}.items():
            d[f"l{i}.{n}"] = torch.randn(*s, generator=g)
    return d

def t(fn):
    s = time.perf_counter(); fn(); return time.perf_counter() - s

root = pathlib.Path(tempfile.mkdtemp(dir=os.environ.get("PROBE_TMP")))
sd = state(); rows = {}
def add(k, v): rows.setdefault(k, []).append(v)
for r in range(4):
    os.sync()
    add("plain_save", t(lambda: torch.save(sd, root / f"p{r}")))
    os.sync()
    p = root / f"a{r}.ckpt"
    add("atomic_save", t(lambda: hashed_save.atomic_save(sd, p)))
    add("seal", t(lambda: integrity.seal(p, {"x": 1}, {p.name: hashed_save.known_entry(p)})))
    add("drain", t(lambda: durable.drain(600)))
    os.sync()
    q = root / f"b{r}.ckpt"
    add("atomic_save2", t(lambda: hashed_save.atomic_save(sd, q)))
    add("drain_before_seal", t(lambda: durable.drain(600)))
    add("seal_after_drain", t(lambda: integrity.seal(q, {"x": 1}, {q.name: hashed_save.known_entry(q)})))
    os.sync()
    # small file fsync + dir fsync right after a big unsynced write that was renamed into the dir
    add("plain_save2", t(lambda: torch.save(sd, root / f"c{r}.tmp")))
    os.rename(root / f"c{r}.tmp", root / f"c{r}")
    def small():
        fd = os.open(root / f"m{r}", os.O_WRONLY | os.O_CREAT | os.O_EXCL); os.write(fd, b"x" * 2000); os.fsync(fd); os.close(fd)
    add("small_fsync_after_rename", t(small))
    add("dir_fsync", t(lambda: integrity.fsync_dir(root)))
    for x in list(root.iterdir()): x.unlink()
for k, v in rows.items():
    print(f"{k:28s} {statistics.median(v):6.3f} s  all {['%.2f' % x for x in v]}", flush=True)
