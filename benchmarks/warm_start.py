"""Ranks forked from the warm supervisor (sprite.launch.warmstart) and from a warm server
(sprite.launch.warmserver) against fresh interpreters, same run.

A 2-rank CPU fit of examples/train.py by `sprite run --devices 2 --accelerator cpu`, three ways, interleaved:
with SPRITE_FORK_RANKS=0 (every rank a fresh interpreter), with the ranks forked from the supervisor (the default
on CPU), and with SPRITE_WARM_SERVER naming a server this script started (the ranks are its forks). Reported:
the wall time and the CPU time of the whole launch (sprite, the supervisor and the ranks: the children's rusage,
plus, for the served launch, the server's reaped children's), as ratios against fresh. The CPU time is what a
loaded machine (a CI box, a shared login node) pays.

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


def reaped_cpu(pid: int | None) -> float:
    """CPU seconds of the children process ``pid`` has waited for (/proc/PID/stat cutime + cstime); 0 without."""
    if pid is None:
        return 0.0
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")


def launch(way: str, steps: int, devices: int, run_dir: Path, server: tuple | None) -> tuple[float, float]:
    """(wall seconds, CPU seconds of every process of the launch)."""
    env = {**clean_env(), "SPRITE_FORK_RANKS": "0" if way == "fresh" else "1"}
    env.pop("SPRITE_WARM_SERVER", None)
    if way == "served":
        env["SPRITE_WARM_SERVER"] = str(server[1])
    served_before = reaped_cpu(server[0].pid if way == "served" else None)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run([str(BIN / "sprite"), "run", "--devices", str(devices), "--accelerator", "cpu", "--run-dir",
                    str(run_dir), str(EXAMPLE), "--max-steps", str(steps)], env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=run_dir.parent)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if way == "served":
        time.sleep(0.5)  # the server reaps its ranks as its loop wakes
        cpu += reaped_cpu(server[0].pid) - served_before
    return wall, cpu


def start_server(folder: Path) -> tuple[subprocess.Popen, Path]:
    from sprite.launch import warmserver

    sock = folder / "warm.sock"
    server = subprocess.Popen(warmserver.command(sock, folder / "warm.log"), env=warmserver.environment(clean_env()),
                              cwd=folder, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while not sock.exists():
        if server.poll() is not None or time.monotonic() > deadline:
            sys.exit("the warm server did not start")
        time.sleep(0.2)
    return server, sock


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--devices", type=int, default=2)
    args = parser.parse_args()
    if args.repeats < 1 or args.steps < 1 or args.devices < 1:
        parser.error("--repeats, --steps and --devices must be 1 or more")
    ways = ("fresh", "forked", "served")
    found = {way: [] for way in ways}
    with tempfile.TemporaryDirectory() as tmp:
        server = start_server(Path(tmp))
        try:
            for repeat in range(args.repeats):
                for way in ways[repeat % 3:] + ways[:repeat % 3]:  # rotate which goes first
                    found[way].append(launch(way, args.steps, args.devices, Path(tmp) / f"r{repeat}-{way}", server))
        finally:
            server[0].terminate()
            server[0].wait()
    load = os.getloadavg()[0]
    print(f"{args.devices}-rank CPU fit of examples/train.py, {args.steps} steps, {args.repeats} launches each way "
          f"(load average {load:.1f}):")
    for what, index in (("wall", 0), ("CPU", 1)):
        median = {way: statistics.median(run[index] for run in found[way]) for way in ways}
        print(f"  {what}: fresh {median['fresh']:.2f} s, forked {median['forked']:.2f} s (ratio "
              f"{median['forked'] / median['fresh']:.2f}), served {median['served']:.2f} s (ratio "
              f"{median['served'] / median['fresh']:.2f})")


if __name__ == "__main__":
    main()
