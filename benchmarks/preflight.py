"""A clean `sprite preflight` of two simulated nodes against one example fit, measured in the same run.

Baseline: `sprite run --devices 2 examples/train.py --max-steps 20` (2 ranks on this machine, gloo). Preflight: a
PBS allocation whose node file lists 127.0.0.1 and 127.0.0.2, started by MPICH Hydra's fork bootstrap (one rank a
node, CPU). Both launch 2 ranks that import torch (and, through sprite's runtime, Lightning), so the ratio says what
the preflight's own work costs on top of what every launch costs. Target: ratio <= 2. Wall times are medians over
--repeats, the two interleaved; the preflight's phases (start-up to the compute record, compute, collectives, and
the launch's end) come from its records, for docs/preflight.md's projection.

    python benchmarks/preflight.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
SPRITE = str(pathlib.Path(sys.executable).with_name("sprite"))


def _env(extra: dict | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PBS_", "SLURM_", "MASTER_", "SPRITE_"))}
    env.pop("RANK", None), env.pop("WORLD_SIZE", None)
    env["PATH"] = os.pathsep.join([str(pathlib.Path(sys.executable).parent), env.get("PATH", "")])
    return {**env, **(extra or {})}


def timed(argv: list[str], env: dict, cwd: str) -> float:
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True)
    took = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{argv[:3]} failed ({done.returncode}): {done.stderr[-2000:]}")
    return took


def phases(out: pathlib.Path, began: float) -> dict:
    """Seconds from the launch to the last compute record, the slowest rank's compute, and the collectives."""
    ranks = out / "ranks"
    computed = [json.loads(p.read_text()) for p in ranks.glob("rank*.compute.json")]
    final = [json.loads(p.read_text()) for p in ranks.glob("rank[0-9].json")]
    return {"startup_s": max(c["started"] for c in computed) - began,
            "compute_s": max(sum(c["all_seconds"]) for c in computed),
            "collectives_s": max(f["ended"] for f in final) - max(c["started"] for c in computed)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    work = pathlib.Path(tempfile.mkdtemp(prefix="preflight-bench-"))
    nodefile = work / "nodes"
    nodefile.write_text("127.0.0.1\n127.0.0.2\n")
    cluster = _env({"PBS_JOBID": "28.bench", "PBS_NODEFILE": str(nodefile), "HYDRA_LAUNCHER": "fork"})
    fits, checks, parts = [], [], []
    for repeat in range(args.repeats):
        fit = [SPRITE, "run", "--devices", "2", "--run-dir", str(work / f"fit{repeat}"),
               str(REPO / "examples" / "train.py"), "--max-steps", "20"]
        out = work / f"preflight{repeat}"
        check = [SPRITE, "preflight", "--devices", "1", "--accelerator", "cpu", "--out", str(out), "--json"]
        order = [("fit", fit, _env()), ("preflight", check, cluster)]
        for name, argv, env in order if repeat % 2 == 0 else order[::-1]:
            began = time.time()
            took = timed(argv, env, str(work))
            (fits if name == "fit" else checks).append(took)
            if name == "preflight":
                parts.append(phases(out, began))
        print(f"repeat {repeat + 1}: fit {fits[-1]:.1f} s, preflight {checks[-1]:.1f} s", flush=True)
    fit_s, check_s = statistics.median(fits), statistics.median(checks)
    summary = {key: round(statistics.median(p[key] for p in parts), 3) for key in parts[0]}
    print(json.dumps({"fit_s": round(fit_s, 2), "preflight_s": round(check_s, 2), "phases": summary,
                      "fits": [round(x, 2) for x in fits], "preflights": [round(x, 2) for x in checks]}))
    print(f"preflight of 2 simulated nodes / one example fit (2 ranks, 20 steps): {check_s / fit_s:.2f}x "
          f"(target <= 2)")


if __name__ == "__main__":
    main()
