"""The arm worker: ``python -m sprite.runtime <this file> --out DIR --arm NAME [--fault F]`` on every rank.

ddp and fsdp arms are a plain Lightning fit; the single-device arms go to single.py. Each arm reads the run's
settings from DIR/run.json and records into its own namespace (DIR/<arm>/, or DIR/fault_<name>/<arm>/ for a
negative control), refusing to overwrite anything there.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys

from sprite.parity import store
from sprite.parity.settings import SINGLE_ARMS, Settings


def arm_dir(out: pathlib.Path, arm: str, fault: str | None) -> pathlib.Path:
    """The namespace one arm records into."""
    return out / f"fault_{fault}" / arm if fault else out / arm


def _meta(settings: Settings, arm: str, fault: str | None) -> dict:
    import lightning
    import torch

    return {
        "arm": arm, "fault": fault, "precision": settings.precision, "model": settings.model,
        "devices": settings.devices, "nodes": settings.nodes, "seed": settings.seed, "steps": settings.steps,
        "global_batch": settings.global_batch, "clip": settings.clip, "lr": settings.lr,
        "torch": torch.__version__, "lightning": lightning.__version__,
    }


def main(argv: list[str] | None = None) -> int:
    """Runs one arm. Returns 0, or raises (the process exits non-zero and the log shows why)."""
    from sprite.runtime import finish

    finish.skip_teardown()  # sprite's own worker: nothing to finalize once its atexit handlers ran (finish.py)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    parser = argparse.ArgumentParser(prog="sprite.parity.check.arm")
    parser.add_argument("--out", required=True, type=pathlib.Path)
    parser.add_argument("--arm", required=True)
    parser.add_argument("--fault", default=None)
    args = parser.parse_args(argv)
    settings = Settings.from_dict(store.read_settings(args.out, store.PARITY, "sprite parity"))
    target = arm_dir(args.out, args.arm, args.fault)
    meta = _meta(settings, args.arm, args.fault)
    if args.arm in SINGLE_ARMS:
        from sprite.parity.check import single

        single.run(args.arm, settings, target, meta)
    else:
        from sprite.parity.check import lightning_arm

        lightning_arm.run(args.arm, args.fault, settings, target, meta)
    return 0


if __name__ == "__main__":
    sys.exit(main())
