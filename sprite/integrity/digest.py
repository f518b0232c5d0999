"""SHA-256 digests of files and buffers for manifests, spread over threads so that hashing keeps up with I/O.

One SHA-256 stream runs at roughly the speed of a memory copy on one core, slower than ``torch.load`` reads a
checkpoint from the page cache, so hashing a whole multi-GB file in one stream would make every verified load
several times slower than the plain load (benchmarks/checkpoint_io.py). A file up to ``CHUNK`` bytes is
described by its whole-file SHA-256 (what ``sha256sum`` prints); a larger one by the SHA-256 of each
``CHUNK``-byte piece, in order, hashed in parallel (hashlib and ``os.pread`` release the GIL). Every byte is
still covered by SHA-256. Stdlib only.
"""

from __future__ import annotations

import hashlib
import os
import threading
from concurrent.futures import ThreadPoolExecutor

CHUNK = 64 << 20  # bytes per separately hashed piece of a large file
MAX_WORKERS = 32  # hashing scales with cores (2 GB, 16-core H200 host: 8 threads ~0.26 s, 16 ~0.14 s; docs/runs)
# Cores a hashing pool started on a thread other than the main one leaves to the rest of its process: a background
# save's hashing runs beside the training loop. Measured beside a Python-bound loop (benchmarks/hash_beside.py): on
# two 16-core H200 hosts the loop lost 49-65% of its speed while 16 threads hashed (51-76 ms a GiB hashed), 12-41%
# with 15 or 14 (13-44 ms a GiB), whose hashing took 2-7% longer (docs/runs/h200-2026-12-04-d, calls 6 and 7); on 2
# cores 37-53% with 2 threads, 0-7% with 1 (docs/runs/cpu-2026-12-04/hash_beside.txt).
SPARE = 2
_READ = 4 << 20  # bytes per read inside a piece (bounded memory per thread)


def rank_cores(env=os.environ) -> int:
    """The cores this process may run on (its affinity), at least 1. Where that is every core of the machine, or
    every core of its cgroup's cpuset (a batch job confined to part of the node, whose ranks all share those
    cores), the ranks were not bound to cores of their own, and this rank takes its share: the cores divided among
    its node's ranks (``LOCAL_WORLD_SIZE``, which every rank sprite launches has; 1 outside a rank). A rank bound to
    fewer cores than that (``mpiexec --cpu-bind``, ``srun --cpu-bind``) keeps them all."""
    machine = os.cpu_count() or 1
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = machine
    if cores < machine and cores != cgroup_cpus():
        return max(1, cores)
    return max(1, cores // local_ranks(env))


def cgroup_cpus(proc: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup") -> int | None:
    """How many CPUs this process's cgroup lets it use (cgroup v2 ``cpuset.cpus.effective``, v1
    ``cpuset/.../cpuset.effective_cpus``); None where that cannot be read."""
    try:
        with open(proc, encoding="utf-8") as lines:
            entries = [line.rstrip("\n").split(":", 2) for line in lines]
        for hierarchy, controllers, path in entries:
            if hierarchy == "0" and not controllers:
                found = os.path.join(root, path.lstrip("/"), "cpuset.cpus.effective")
                if os.path.exists(found):
                    break
            if "cpuset" in controllers.split(","):
                found = os.path.join(root, "cpuset", path.lstrip("/"), "cpuset.effective_cpus")
                break
        else:
            return None
        with open(found, encoding="utf-8") as listing:
            return _count_cpus(listing.read().strip())
    except (OSError, ValueError):
        return None


def _count_cpus(listing: str) -> int | None:
    """CPUs in a kernel cpu list such as ``0-3,8-11`` (None when empty). Raises ValueError for another text."""
    total = 0
    for part in filter(None, listing.split(",")):
        low, _, high = part.partition("-")
        total += int(high or low) - int(low) + 1
    return total or None


def local_ranks(env=os.environ) -> int:
    """The ranks of this process's node (``LOCAL_WORLD_SIZE``, which every rank sprite launches has): 1 outside a
    rank, or where the value is not a positive number."""
    try:
        return max(1, int(env.get("LOCAL_WORLD_SIZE", "1") or 1))
    except ValueError:
        return 1


def workers() -> int:
    """Threads used for hashing: :func:`rank_cores`, less ``SPARE`` when called on a thread other than the main one
    (beside the training loop), at most ``MAX_WORKERS`` and at least 1."""
    beside = threading.current_thread() is not threading.main_thread()
    return max(1, min(MAX_WORKERS, rank_cores() - (SPARE if beside else 0)))


def _pieces(size: int) -> list[tuple[int, int]]:
    return [(start, min(CHUNK, size - start)) for start in range(0, size, CHUNK)] or [(0, 0)]


def _entry(size: int, digests: list[str]) -> dict:
    if len(digests) == 1:
        return {"size": size, "sha256": digests[0]}
    return {"size": size, "chunk_bytes": CHUNK, "sha256_chunks": digests}


def _hash_range(fd: int, start: int, length: int) -> str:
    hasher, done = hashlib.sha256(), 0
    while done < length:
        data = os.pread(fd, min(_READ, length - done), start + done)
        if not data:
            raise OSError(f"the file ended {length - done} bytes early while being hashed (changed meanwhile?)")
        hasher.update(data)
        done += len(data)
    return hasher.hexdigest()


def files(paths: list) -> list[dict]:
    """``{"size", "sha256"}`` or ``{"size", "chunk_bytes", "sha256_chunks"}`` for each regular file in ``paths``
    (never read through a symlink), every piece of every file hashed on a shared pool of threads.

    Raises:
        OSError: a file cannot be opened or read (a symlink gives ELOOP).
    """
    fds = []
    try:
        for path in paths:
            fds.append(os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC))
        return _describe(fds)
    finally:
        for fd in fds:
            os.close(fd)


def open_file(fd: int, beside=None) -> dict:
    """The description of the file open as ``fd`` (read with ``os.pread``, so any open mode that reads works),
    while ``beside()`` (an fsync of the same file, say) runs on one more thread of the same pool.

    Raises:
        OSError: the file cannot be read, or ``beside`` raised it.
    """
    return _describe([fd], beside)[0]


def _describe(fds: list[int], beside=None) -> list[dict]:
    sizes = [os.fstat(fd).st_size for fd in fds]
    jobs = [(fd, start, length) for fd, size in zip(fds, sizes) for start, length in _pieces(size)]
    if len(jobs) <= 1 and beside is None:
        digests = [_hash_range(*job) for job in jobs]
    else:
        with ThreadPoolExecutor(max_workers=min(workers(), len(jobs)) + (beside is not None)) as pool:
            side = pool.submit(beside) if beside is not None else None  # first, so it starts at once
            digests = list(pool.map(lambda job: _hash_range(*job), jobs))
            if side is not None:
                side.result()
    entries, at = [], 0
    for size in sizes:
        count = len(_pieces(size))
        entries.append(_entry(size, digests[at:at + count]))
        at += count
    return entries


def same(found: dict, recorded: dict) -> bool:
    """Whether a computed description equals the one a manifest recorded (either form)."""
    if "sha256_chunks" in recorded:
        return recorded.get("chunk_bytes") == CHUNK and found.get("sha256_chunks") == recorded["sha256_chunks"]
    return found.get("sha256") == recorded.get("sha256")
