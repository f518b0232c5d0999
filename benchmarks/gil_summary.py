"""Who holds the GIL in a rank: a summary of a `py-spy record --gil --threads --format raw` profile (issue 26).

    py-spy record --gil --threads --subprocesses -r 100 --format raw -o gil.txt -- python benchmarks/checkpoint_io.py ...
    python benchmarks/gil_summary.py gil.txt [--rate 100]

Prints the seconds each kind of thread held the GIL (the training loop's main thread, torch's async checkpoint
executor, torch's file writer threads, the rest) and, for the async executor, the torch functions it held it in.
"""

from __future__ import annotations

import argparse
import collections
import re

WATCHED = ("_DistWrapper.reduce_scatter", "_DistWrapper.all_reduce", "create_local_plan", "Writer.write_data",
           "gather_object (", "scatter_object_list (")


def kind(thread: str) -> str:
    if "MainThread" in thread:
        return "main (training loop)"
    if "AsyncCheckpointExecutor" in thread:
        return "async checkpoint executor"
    if "_write_files_from_queue" in thread:
        return "file writers"
    return "other (autograd, sprite's seal, hashing)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("profile")
    parser.add_argument("--rate", type=float, default=100.0, help="py-spy's samples a second (-r)")
    args = parser.parse_args()
    held, inside = collections.Counter(), collections.Counter()
    with open(args.profile) as lines:
        for line in lines:
            stack, count = line.rstrip().rsplit(" ", 1)
            frames = stack.split(";")
            thread = next((f for f in frames if f.startswith("thread ")), "")
            held[kind(thread)] += int(count)
            if kind(thread) == "async checkpoint executor":
                names = {re.sub(r":\d+\)", ")", f) for f in frames}
                for watched in WATCHED:
                    if any(watched in name for name in names):
                        inside[watched] += int(count)
    for name, count in held.most_common():
        print(f"{count / args.rate:7.2f} s  {name}")
    for name, count in inside.most_common():
        print(f"{count / args.rate:7.2f} s    of the executor's, inside {name.rstrip(' (')}")


if __name__ == "__main__":
    main()
