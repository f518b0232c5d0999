"""JobSpec fields for one launch of the checkpoint check (pure: a test can compare them)."""

from __future__ import annotations

import os
import pathlib

from sprite.parity.ckpt.roles import Launch
from sprite.parity.ckpt.settings import CkptSettings


def overrides(out: pathlib.Path, launch: Launch, settings: CkptSettings, threads: int = 0) -> dict:
    """What `sprite run` would be given for ``launch``: the worker script and its arguments, the launch's world,
    strategy, precision and accelerator. ``threads`` > 0 caps a one-process launch's CPU threads."""
    from sprite.parity.ckpt import worker as ckpt_worker

    env = {"HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    if threads and "OMP_NUM_THREADS" not in os.environ:
        env["OMP_NUM_THREADS"] = str(threads)
    return {
        "script": ckpt_worker.__file__,
        "args": ["--out", os.fspath(out), "--launch", launch.key],
        "devices": launch.devices,
        "nodes": launch.nodes,
        "strategy": launch.strategy,
        "precision": settings.precision,
        "accelerator": settings.accelerator,
        "env": env,
    }
