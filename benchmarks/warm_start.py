"""Ranks forked from the warm supervisor against fresh interpreters (sprite.launch.warmstart), same run.

A 2-rank CPU fit of examples/train.py by `sprite run --devices 2 --accelerator cpu`, with the ranks forked (the
default on CPU) and with SPRITE_FORK_RANKS=0 (every rank a fresh interpreter), interleaved. Reported: the wall
time and the CPU time of the whole launch (sprite, the supervisor and the ranks: the children's rusage), as
ratios fork / fresh. The CPU time is what a loaded machine (a CI box, a shared login node) pays.

    python benchmarks/warm_start.py [--repeats 3] [--steps 5] [--devices 2]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
EXAMPLE = REPO / "examples" / "train.py"


def clean_env() -> dict:
    drop = ("PBS_JOBID", "PBS_NODEFILE", "SLURM_JOB_ID", "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["PATH"] = os.pathsep.join([str(BIN), env.get("PATH", "")])
    return env


def launch(fork: bool, steps: int, devices: int, run_dir: Path) -> tuple[float, float]:
    """(wall seconds, CPU seconds of every process of the launch)."""
    env = {**clean_env(), "SPRITE_FORK_RANKS": "1" if fork else "0"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([str(BIN / "sprite"), "run", "--devices", str(devices), "--accelerator", "cpu", "--run-dir",
                    str(run_dir), str(EXAMPLE), "--max-steps", str(steps)], env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=run_dir.parent)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--devices", type=int, default=2)
    args = parser.parse_args()
    if args.repeats < 1 or args.steps < 1 or args.devices < 1:
        parser.error("--repeats, --steps and --devices must be 1 or more")
    found = {True: [], False: []}
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            for fork in (repeat % 2 == 0, repeat % 2 != 0):  # alternate which goes first
                found[fork].append(launch(fork, args.steps, args.devices, Path(tmp) / f"r{repeat}-{int(fork)}"))
    load = os.getloadavg()[0]
    print(f"{args.devices}-rank CPU fit of examples/train.py, {args.steps} steps, {args.repeats} launches each way "
          f"(load average {load:.1f}):")
    for what, index in (("wall", 0), ("CPU", 1)):
        fork = statistics.median(run[index] for run in found[True])
        fresh = statistics.median(run[index] for run in found[False])
        print(f"  {what}: forked {fork:.2f} s, fresh {fresh:.2f} s, ratio {fork / fresh:.2f}")


if __name__ == "__main__":
    main()
