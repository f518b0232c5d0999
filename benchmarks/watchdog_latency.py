"""How long after a rank stops stepping sprite notices (detection) and has stopped everything (exit 124), against
the stall timeout, for real 2-rank CPU fits in which rank 1 sleeps inside training_step.

    python benchmarks/watchdog_latency.py --timeouts 2 5 10 --launcher local

Detection latency is measured from the rank's "sleeps" line to sprite's stall line, on this process's clock as
each line arrives; it should be the timeout plus at most a heartbeat interval (a tenth of the timeout, at least
0.5 s) and a polling period. Stop time adds the SIGTERM grace (5 s) when the ranks ignore SIGTERM.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "tests" / "scripts" / "fit_faults.py"


def measure(timeout: float, launcher: list[str], work: Path) -> dict:
    cmd = [str(Path(sys.executable).parent / "sprite"), "run", "--devices", "2", *launcher, "--stall-timeout",
           str(timeout), "--run-dir", str(work / f"run-{timeout}-{time.time_ns()}"), str(SCRIPT),
           "--sleep-rank", "1", "--sleep-step", "3"]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = subprocess.Popen(cmd, cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    slept = detected = None
    for line in proc.stdout:
        now = time.monotonic()
        if slept is None and "sleeps in training_step" in line:
            slept = now
        if detected is None and line.startswith("sprite: error: Stopped the run"):
            detected = now
    code = proc.wait()
    ended = time.monotonic()
    if code != 124 or slept is None or detected is None:
        raise SystemExit(f"timeout {timeout}: expected exit 124 with both lines, got {code}")
    return {"timeout": timeout, "detect": detected - slept, "stop": ended - slept}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeouts", type=float, nargs="+", default=[2.0, 5.0, 10.0])
    parser.add_argument("--launcher", choices=("local", "hydra"), default="local")
    args = parser.parse_args()
    launcher = ["--launcher", "local"] if args.launcher == "local" else ["--launcher", "mpiexec", "--mpi", "hydra"]
    with tempfile.TemporaryDirectory(prefix="watchdog-latency-") as work:
        rows = [measure(t, launcher, Path(work)) for t in args.timeouts]
    print(f"stall watchdog, 2-rank CPU fit, {args.launcher} launcher (times from the rank's last step):")
    print(f"  {'timeout':>8} {'detected':>9} {'ratio':>6} {'late by':>8} {'all stopped':>12}")
    for r in rows:
        print(f"  {r['timeout']:7.1f}s {r['detect']:8.2f}s {r['detect'] / r['timeout']:6.2f} "
              f"{r['detect'] - r['timeout']:7.2f}s {r['stop']:11.2f}s")


if __name__ == "__main__":
    main()
