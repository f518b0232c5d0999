"""What the harnesses cost in process start-up (issue 31), as ratios against one plain fit measured in the same run.

Baseline: `sprite run --devices 2 examples/train.py --max-steps 20` (one 2-rank CPU fit). Against it:
(a) the full BF16 parity check with both loss-level faults, 2 CPU ranks, in warm pools (the default; target
    within 2.5x), and the same check with --fresh-processes (every arm its own launch, as before the pools);
(b) a `tiny` bench sweep of 1,2 (target within 2x), with its timed windows printed apart (no start-up saving
    removes them);
(c) with --ckpt-check: `sprite ckpt-check --devices 2` (FP32, tiny) in warm pools against the same check with
    --fresh-processes (target: at least 2x faster).
Runs are interleaved per repeat, so a drift of the machine spreads over all of them.

    python benchmarks/harness_startup.py [--repeats 1] [--no-fresh] [--no-bench] [--ckpt-check]
        [--sprite "python -m sprite"]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
EXAMPLE = REPO / "examples" / "train.py"
PARITY = ["parity", "--precision", "bf16-mixed", "--devices", "2", "--accelerator", "cpu",
          "--fault", "missing-rank", "--fault", "wrong-scale"]


def clean_env() -> dict:
    drop = ("PBS_JOBID", "PBS_NODEFILE", "SLURM_JOB_ID", "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["PATH"] = os.pathsep.join([str(BIN), env.get("PATH", "")])
    env.setdefault("HF_HUB_OFFLINE", "1")
    return env


def timed(sprite: list[str], args: list[str], env: dict, cwd: str) -> float:
    start = time.perf_counter()
    done = subprocess.run([*sprite, *args], env=env, cwd=cwd, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"`sprite {' '.join(args)}` exited {done.returncode}:\n{done.stdout[-3000:]}")
    return seconds


def timed_windows(bench_out: Path) -> float:
    """The seconds of every timed window of a bench run, summed over its launches (rank 0's records)."""
    return sum(window["seconds"] for record in bench_out.glob("runs/*/*/rank0.json")
               for window in json.loads(record.read_text())["windows"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--no-fresh", action="store_true", help="skip the --fresh-processes parity run")
    parser.add_argument("--no-bench", action="store_true", help="skip the bench sweep")
    parser.add_argument("--ckpt-check", action="store_true", help="also time ckpt-check, pooled and fresh")
    parser.add_argument("--sprite", help="how to call sprite (default: the sprite script beside this Python), "
                        "e.g. \"python -m sprite\" where sprite was installed with pip --target")
    args = parser.parse_args()
    sprite = shlex.split(args.sprite) if args.sprite else [str(BIN / "sprite")]
    env = clean_env()
    runs = {"fit": [], "parity": [], "parity_fresh": [], "bench": [], "ckpt": [], "ckpt_fresh": []}
    bench_timed = []  # seconds of the bench's timed windows, summed over its launches (rank 0's clock)
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            out = Path(tmp) / str(repeat)
            out.mkdir()
            runs["fit"].append(timed(sprite, ["run", "--devices", "2", "--accelerator", "cpu", str(EXAMPLE),
                                      "--max-steps", "20"], env, str(out)))
            runs["parity"].append(timed(sprite, [*PARITY, "--out", str(out / "parity")], env, tmp))
            if not args.no_fresh:
                runs["parity_fresh"].append(timed(sprite, [*PARITY, "--fresh-processes", "--out", str(out / "fresh")],
                                                  env, tmp))
            if not args.no_bench:
                bench = ["bench", "--model", "tiny", "--sweep", "1,2", "--accelerator", "cpu",
                         "--out", str(out / "bench")]
                runs["bench"].append(timed(sprite, bench, env, tmp))
                bench_timed.append(timed_windows(out / "bench"))
            if args.ckpt_check:
                check = ["ckpt-check", "--devices", "2", "--accelerator", "cpu"]
                runs["ckpt"].append(timed(sprite, [*check, "--out", str(out / "ckpt")], env, tmp))
                runs["ckpt_fresh"].append(timed(sprite, [*check, "--fresh-processes", "--out", str(out / "ckpt-fresh")],
                                                env, tmp))
    fit = statistics.median(runs["fit"])
    print(f"baseline: sprite run --devices 2 examples/train.py --max-steps 20: {fit:.1f} s "
          f"(median of {args.repeats})")
    rows = [("parity", "BF16 parity + missing-rank + wrong-scale, warm pools", 2.5),
            ("parity_fresh", "the same with --fresh-processes", None),
            ("bench", "bench --model tiny --sweep 1,2", 2.0),
            ("ckpt", "ckpt-check FP32, warm pools", None), ("ckpt_fresh", "ckpt-check FP32, --fresh-processes", None)]
    for key, what, target in rows:
        if runs[key]:
            seconds = statistics.median(runs[key])
            goal = f" (target {target}x)" if target else ""
            print(f"{what}: {seconds:.1f} s, ratio {seconds / fit:.2f}{goal}")
    if bench_timed:
        floor = statistics.median(bench_timed)
        print(f"  of which the timed steps themselves: {floor:.1f} s, {floor / fit:.2f}x the fit (no start-up saving "
              f"removes them); the rest: {statistics.median(runs['bench']) - floor:.1f} s, "
              f"{(statistics.median(runs['bench']) - floor) / fit:.2f}x")
    if runs["parity"] and runs["parity_fresh"]:
        speedup = statistics.median(runs["parity_fresh"]) / statistics.median(runs["parity"])
        print(f"warm pools vs fresh processes: {speedup:.2f}x faster")
    if runs["ckpt"]:
        speedup = statistics.median(runs["ckpt_fresh"]) / statistics.median(runs["ckpt"])
        print(f"ckpt-check, warm pools vs fresh processes: {speedup:.2f}x faster (target at least 2x)")


if __name__ == "__main__":
    main()
