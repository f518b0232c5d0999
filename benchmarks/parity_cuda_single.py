"""The BF16 check's single-device arms (ref32, ref, split, split_premul) on one GPU, through sprite's launch
plan, with their invariants, the split_premul validity gate and the BF16-vs-FP32 diagnostics.

For a machine with one GPU, where the ddp/fsdp arms cannot run (one rank per device). Prints a JSON summary
and writes it to --summary if given.

    HF_HUB_OFFLINE=1 python benchmarks/parity_cuda_single.py --model qwen2.5-0.5b-shape --devices 2
"""

from __future__ import annotations

import argparse
import json
import pathlib
import tempfile
import time

from rich.console import Console

from sprite.parity import store
from sprite.parity.check import bf16
from sprite.parity.check.invariants import invariants
from sprite.parity.launch import launch_arm
from sprite.parity.check.runner import claim_dir
from sprite.parity.settings import SINGLE_ARMS, Settings


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="qwen2.5-0.5b-shape")
    parser.add_argument("--devices", type=int, default=2, help="N: the world the split arms replay")
    parser.add_argument("--accelerator", default="cuda")
    parser.add_argument("--summary", type=pathlib.Path, default=None)
    args = parser.parse_args()
    out = pathlib.Path(tempfile.mkdtemp(prefix="parity_cuda_")) / "run"
    settings = Settings(precision="bf16-mixed", devices=args.devices, model=args.model, accelerator=args.accelerator)
    claim_dir(out, settings)
    console, seconds = Console(), {}
    for arm in SINGLE_ARMS:
        start = time.monotonic()
        code = launch_arm(out, arm, None, settings, out / "logs" / f"{arm}.log")
        seconds[arm] = round(time.monotonic() - start, 1)
        console.print(f"{arm}: exit {code} in {seconds[arm]} s")
        if code:
            console.print((out / "logs" / f"{arm}.log").read_text()[-3000:])
            raise SystemExit(1)
    arms = {arm: store.load_arm(out / arm) for arm in SINGLE_ARMS}
    digest = arms["ref"]["ranks"][0]["initial_digest"]
    inv = [c for arm, data in arms.items() for c in invariants(arm, data, settings, digest)]
    gate = bf16.scored("gate split_premul", arms["split_premul"], arms["split"])
    record = arms["ref"]["ranks"][0]
    summary = {
        "model": args.model, "world_replayed": args.devices, "device": record["meta"]["device"],
        "torch": record["meta"]["torch"], "lightning": record["meta"]["lightning"],
        "trainable_tensors": record["trainable_count"], "frozen_tensors": record["frozen_count"],
        "invariants_failed": [c["name"] for c in inv if not c["passed"]], "invariants_total": len(inv),
        "gate": [{k: c[k] for k in ("name", "value", "passed")} for c in gate],
        "diagnostics": bf16.diagnostics(arms, settings.steps), "arm_seconds": seconds,
    }
    text = json.dumps(store.clean(summary), indent=1)
    console.print(text)
    if args.summary:
        args.summary.write_text(text)


if __name__ == "__main__":
    main()
