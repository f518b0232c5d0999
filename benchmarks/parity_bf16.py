"""Wall time of the full BF16 parity check with both loss-level faults (missing-rank, wrong-scale), 2 CPU
ranks, model `tiny`, split into process start-up and compute. Target on a 2-core machine: under 3 minutes.

    HF_HUB_OFFLINE=1 python benchmarks/parity_bf16.py [--devices 2] [--model tiny] [--out DIR]

Start-up of an arm = launch until its last rank is ready to train (interpreter, imports, process group, model
build); compute = ready until its last rank finished recording; exit = the rest (teardown, process exit).
Single-device arms run two at a time, so per-arm sums exceed the wall time of that phase.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import tempfile
import time

from rich.console import Console

from sprite.parity.check.compare import compare, overall
from sprite.parity.check.runner import claim_dir, run_arms
from sprite.parity.settings import Settings


def _split(out: pathlib.Path, label: str, start: float, end: float) -> dict:
    records = [json.loads(p.read_text()) for p in sorted((out / label).glob("rank*.json"))]
    ready = max(r["timing"]["ready"] for r in records)
    done = max(r["timing"]["done"] for r in records)
    return {"startup_s": ready - start, "compute_s": done - ready, "exit_s": end - done}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--out", type=pathlib.Path, default=None)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    out = args.out or pathlib.Path(tempfile.mkdtemp(prefix="parity_bf16_")) / "run"
    settings = Settings(precision="bf16-mixed", devices=args.devices, model=args.model,
                        faults=("missing-rank", "wrong-scale"))
    console = Console()
    start = time.monotonic()
    claim_dir(out, settings)
    times = run_arms(out, settings, console)
    compare_start = time.monotonic()
    verdict = overall(compare(out))
    compare_s, total = time.monotonic() - compare_start, time.monotonic() - start
    arms = {label: _split(out, label, *stamps) for label, stamps in times.pop("launches").items()}
    console.print(f"{'arm':28} {'start-up s':>10} {'compute s':>10} {'exit s':>8}")
    for label, part in arms.items():
        console.print(f"{label:28} {part['startup_s']:10.1f} {part['compute_s']:10.1f} {part['exit_s']:8.1f}")
    sums = {key: sum(part[key] for part in arms.values()) for key in ("startup_s", "compute_s", "exit_s")}
    figures = {
        "verdict": verdict, "wall_total_s": round(total, 1), "clean_arms_wall_s": round(times["clean_arms_s"], 1),
        "fault_arms_wall_s": round(times["fault_arms_s"], 1), "compare_s": round(compare_s, 1),
        "startup_sum_s": round(sums["startup_s"], 1), "compute_sum_s": round(sums["compute_s"], 1),
        "exit_sum_s": round(sums["exit_s"], 1), "launches": len(arms), "out": str(out),
    }
    console.print(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
