"""The rank worker: ``python -m sprite.runtime <this file> --out DIR --launch KEY`` on every rank of one launch.

Reads the check's settings from DIR/run.json and the launch from the roles table, then runs its fit(s): one for
fit, twin, killed, reload and reshard; the resume and then the arm's three fault cases (each a fresh Trainer
restoring the same checkpoint); and for export one fit per exported checkpoint, the sharded one consolidated
into a single file first.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys

from sprite.parity import store
from sprite.parity.ckpt.roles import Launch, checkpoint, consolidated, fault_dir, launches, result_dir
from sprite.parity.ckpt.settings import EXPORTED, FAULTS, CkptSettings


def _meta(settings: CkptSettings, launch: Launch, arm: str, role: str, fault: str | None = None) -> dict:
    import lightning
    import torch

    return {"arm": arm, "role": role, "fault": fault, "launch": launch.key, "precision": settings.precision,
            "model": settings.model, "torch": torch.__version__, "lightning": lightning.__version__}


def plans(out: pathlib.Path, settings: CkptSettings, launch: Launch):
    """(FitPlan, strategy) for every fit this launch runs, in order."""
    from sprite.parity.ckpt.module import FitPlan

    arm, role, strategy = launch.arm, launch.role, launch.strategy

    def plan(target, meta_role, **kw):
        return FitPlan(out=out, target=target, meta=_meta(settings, launch, arm, meta_role, kw.get("fault")), **kw)

    if role in ("fit", "twin"):
        return [(plan(result_dir(arm, role), role), strategy)]
    if role == "killed":
        saves = ((checkpoint(arm, "killed", 1), arm == "fsdp"),)
        if arm == "fsdp":  # one FSDP2 state, both formats (ckpt_roles explains why)
            saves += ((checkpoint("fsdp_file", "killed", 1), False),)
        return [(plan(result_dir(arm, role), role, saves=saves, kill_after=settings.steps_per_epoch + 1,
                      gather=True), strategy)]
    if role == "resume":
        source = checkpoint(arm, "killed", 1)
        fits = [(plan(result_dir(arm, role), role, load=source, gather=True,
                      save_final=(checkpoint(arm, "resume", 2), arm == "fsdp")), strategy)]
        return fits + [(plan(fault_dir(arm, f), "fault", load=source, fault=f), strategy) for f in FAULTS]
    if role == "reload":
        return [(plan(result_dir(arm, role), role, load=checkpoint(arm, "resume", 2), stop_at_start=True), strategy)]
    if role == "reshard":
        return [(plan(result_dir(arm, role), role, load=checkpoint(arm, "killed", 1), gather=True), strategy)]
    if role == "export":
        return [(FitPlan(out=out, target=result_dir(a, "export"), meta=_meta(settings, launch, a, "export"),
                         load=consolidated(a) if a == "fsdp" else checkpoint(a, "killed", 1), gather=True), "single")
                for a in EXPORTED]
    raise ValueError(f"unknown role {role!r}")


def main(argv: list[str] | None = None) -> int:
    """Runs one launch's fits. Returns 0, or raises (the launch exits non-zero and its log says why)."""
    from sprite.runtime import finish

    finish.skip_teardown()  # sprite's own worker: nothing to finalize once its atexit handlers ran (finish.py)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    parser = argparse.ArgumentParser(prog="sprite.parity.ckpt.worker")
    parser.add_argument("--out", required=True, type=pathlib.Path)
    parser.add_argument("--launch", required=True)
    args = parser.parse_args(argv)
    settings = CkptSettings.from_dict(store.read_settings(args.out, store.CKPT_CHECK, "sprite ckpt-check"))
    launch = next(item for item in launches(settings) if item.key == args.launch)
    from sprite.parity.ckpt.fit import fit

    for fit_plan, strategy in plans(args.out, settings, launch):
        if launch.role == "export" and fit_plan.load == consolidated():
            from sprite.runtime.ckpt.consolidate import consolidate

            consolidate(args.out / checkpoint("fsdp", "killed", 1), args.out / fit_plan.load)
        fit(settings, fit_plan, strategy)
    return 0


if __name__ == "__main__":
    sys.exit(main())
