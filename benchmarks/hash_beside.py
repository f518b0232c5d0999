"""What hashing a checkpoint's files costs a training loop in the same process, by the number of hashing threads,
each arm measured in the same run against the loop alone.

A background save ends on the rank's own thread: the files are hashed from the page cache
(``sprite.integrity.digest``, a pool of ``digest.workers()`` threads) while the training loop goes on. Each hashing
thread takes the GIL between its reads and its digests, and the threads share the host's cores with the loop. Here
a file of ``--gib`` GiB is written and read once (so it is in the page cache, as a file just written is), then for
each thread count in ``--threads``, medians over ``--repeats`` with the arms interleaved:
- hash: the seconds ``digest.files`` takes for the file alone;
- lost: a Python-bound loop of small tensor operations (its steps hold and release the GIL, as a training loop's
  dispatch does) runs while a thread hashes the file ``--passes`` times; the time the hashing took less what the
  steps done meanwhile take alone (timed just before), as a share of the hashing time (the fraction of the loop's
  speed it lost) and in milliseconds per GiB hashed.

    python benchmarks/hash_beside.py [--gib 1] [--threads 16,8,4,2,1] [--repeats 3] [--passes 5] [--steps 400]
        [--dir /tmp]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time


sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from shared_send import _alone, _beside  # noqa: E402  (the same Python-bound loop, beside a send there)


def _hash(path: str, threads: int) -> float:
    from sprite.integrity import digest

    digest.workers = lambda: threads  # exactly ``threads``, on any thread (sprite's own count is less beside the loop)
    start = time.perf_counter()
    digest.files([path])
    return time.perf_counter() - start


def _lost(path: str, threads: int, passes: int, step: float, value) -> tuple[float, float]:
    """``(share of the loop's speed, seconds)`` the loop lost while a thread hashed the file ``passes`` times
    (``step``: a step's seconds alone)."""
    elapsed, lost = _beside(lambda: [_hash(path, threads) for _ in range(passes)], step, value)
    lost = max(0.0, lost)
    return lost / elapsed, lost


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=1.0, help="size of the file hashed")
    parser.add_argument("--threads", default="", help="hashing thread counts to compare (default: the cores, "
                                                      "halved down to 1)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--passes", type=int, default=5, help="hashings of the file beside each timed loop")
    parser.add_argument("--steps", type=int, default=400, help="steps timed alone before each arm")
    parser.add_argument("--dir", default=None, help="where the file is written (default: the temporary folder)")
    args = parser.parse_args()
    from sprite.integrity.digest import rank_cores

    cores = rank_cores()  # this process's cores (outside a rank: its affinity, not shared)
    try:
        counts = [int(part) for part in args.threads.split(",") if part.strip()] or \
            sorted({max(1, cores >> shift) for shift in range(cores.bit_length())}, reverse=True)
    except ValueError:
        parser.error(f"--threads takes counts separated by commas, not {args.threads!r}")
    if min(counts) < 1 or min(args.repeats, args.passes, args.steps) < 1 or not 1 / 1024 <= args.gib <= 64:
        parser.error("--threads counts, --repeats, --passes and --steps must be 1 or more, --gib from 1/1024 (a MiB)"
                     " to 64")
    import torch

    torch.set_num_threads(1)
    value = torch.ones(64)
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        path = os.path.join(tmp, "shard.distcp")
        block = os.urandom(1 << 20)
        with open(path, "wb") as out:
            for _ in range(round(args.gib * 1024)):  # MiB
                out.write(block)
        size = os.path.getsize(path)
        _hash(path, cores)  # read once: the page cache holds it, as it holds a file just written
        hashed = {n: [] for n in counts}
        lost = {n: [] for n in counts}
        for _ in range(args.repeats):
            for n in counts:  # interleaved, so drift in the machine touches every arm alike
                hashed[n].append(_hash(path, n))
                lost[n].append(_lost(path, n, args.passes, _alone(args.steps, value), value))
    print(f"{size / 2**30:.2f} GiB hashed ({args.passes} times beside each loop), {cores} cores, {args.repeats} "
          f"repeats, torch {torch.__version__}")
    best = min(statistics.median(hashed[n]) for n in counts)
    for n in counts:
        alone = statistics.median(hashed[n])
        share = statistics.median(part for part, _ in lost[n])
        per_gib = statistics.median(seconds for _, seconds in lost[n]) / (args.passes * size / 2**30)
        print(f"{n:>3} threads: hash {alone:.3f} s ({size / alone / 2**30:.2f} GiB/s, {alone / best:.2f}x the "
              f"fastest); the loop beside it lost {share * 100:.1f}% of its speed, {per_gib * 1000:.1f} ms a GiB "
              "hashed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
