"""Starting one arm through sprite's own launch path (the LaunchPlan that `sprite run` executes).

Every rank runs ``python -m sprite.runtime <arm.py> --out DIR --arm NAME [--fault F]``; the runtime fills the
arm's Trainer from the launched world. ddp/fsdp arms launch the whole world, the single-device arms one rank.
"""

from __future__ import annotations

import os
import pathlib
import subprocess

from sprite.integrity import owner_only
from sprite.parity.settings import DISTRIBUTED_ARMS, Settings


def arm_overrides(out: pathlib.Path, arm: str, fault: str | None, settings: Settings, threads: int = 0) -> dict:
    """JobSpec fields for one arm (pure: a test can compare them). ``threads`` > 0 caps its CPU threads."""
    from sprite.parity.check import arm as worker

    args = ["--out", os.fspath(out), "--arm", arm] + (["--fault", fault] if fault else [])
    distributed = arm in DISTRIBUTED_ARMS
    env = {"HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    if threads and "OMP_NUM_THREADS" not in os.environ:
        env["OMP_NUM_THREADS"] = str(threads)
    return {
        "script": worker.__file__,
        "args": args,
        "devices": settings.devices if distributed else 1,
        "nodes": settings.nodes if distributed else 1,
        "strategy": arm if distributed else "single",
        "precision": settings.precision,
        "accelerator": settings.accelerator,
        "env": env,
    }


def launch(flags: dict, log: pathlib.Path, limit: float | None = None, cancel=None) -> int | None:
    """Plans ``flags`` (JobSpec fields) as `sprite run` would and runs it to completion, all output to ``log``.

    Returns the launcher's exit code, or None when it ran past ``limit`` seconds; by then every process it
    started has been stopped. Raises InterruptedError when ``cancel`` (a threading.Event) was set (the launch
    is stopped first), UsageError when the launch cannot be planned (e.g. --nodes > 1 outside an
    allocation).
    """
    from sprite.launch.execute import run_plan
    from sprite.launch.plan import plan_run

    plan = plan_run(flags)
    owner_only.make_dirs(log.parent)
    try:
        return run_plan(plan, log_path=log, timeout=limit, cancel=cancel)
    except subprocess.TimeoutExpired:
        with owner_only.open_log(log) as handle:
            handle.write(f"sprite: stopped: still running after the time limit of {limit:g} s\n".encode())
        return None


def launch_arm(out: pathlib.Path, arm: str, fault: str | None, settings: Settings, log: pathlib.Path,
               threads: int = 0, limit: float | None = None) -> int | None:
    """Runs one arm (see ``launch``): its exit code, or None when it ran past ``limit`` seconds."""
    return launch(arm_overrides(out, arm, fault, settings, threads), log, limit)
