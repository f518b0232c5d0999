"""Starting one launch of a harness (a parity arm, a ckpt-check role, a bench arm) through sprite's own launch
path: the JobSpec fields `sprite run` would be given, and the LaunchPlan it executes, run to completion.

Every rank runs ``python -m sprite.runtime <worker.py> --out DIR ...``; the runtime fills the worker's Trainer
from the launched world. For parity, ddp/fsdp arms launch the whole world, the single-device arms one rank.
"""

from __future__ import annotations

import os
import pathlib
import subprocess

from sprite.integrity import owner_only
from sprite.parity.settings import DISTRIBUTED_ARMS, Settings


def job_fields(script: str, args: list[str], *, devices: int, nodes: int, strategy: str, precision: str,
               accelerator: str, threads: int = 0) -> dict:
    """What `sprite run` would be given for one launch of a worker ``script`` (pure: a test can compare them).
    ``threads`` > 0 caps its CPU threads (OMP_NUM_THREADS), unless this shell sets them already."""
    env = {"HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    if threads and "OMP_NUM_THREADS" not in os.environ:
        env["OMP_NUM_THREADS"] = str(threads)
    return {"script": script, "args": args, "devices": devices, "nodes": nodes, "strategy": strategy,
            "precision": precision, "accelerator": accelerator, "env": env}


def arm_overrides(out: pathlib.Path, arm: str, fault: str | None, settings: Settings, threads: int = 0) -> dict:
    """JobSpec fields for one parity arm (see ``job_fields``)."""
    from sprite.parity.check import arm as worker

    distributed = arm in DISTRIBUTED_ARMS
    return job_fields(worker.__file__, ["--out", os.fspath(out), "--arm", arm] + (["--fault", fault] if fault else []),
                      devices=settings.devices if distributed else 1, nodes=settings.nodes if distributed else 1,
                      strategy=arm if distributed else "single", precision=settings.precision,
                      accelerator=settings.accelerator, threads=threads)


def launch(flags: dict, log: pathlib.Path, limit: float | None = None, cancel=None) -> int | None:
    """Plans ``flags`` (JobSpec fields) as `sprite run` would and runs it (see ``run``). Raises UsageError
    when the launch cannot be planned (e.g. --nodes > 1 outside an allocation)."""
    from sprite.launch.plan import plan_run

    return run(plan_run(flags), log, limit, cancel)


def run(plan, log: pathlib.Path, limit: float | None = None, cancel=None) -> int | None:
    """Runs ``plan`` (a LaunchPlan) to completion, all output appended to ``log``.

    Returns the launcher's exit code, or None when it ran past ``limit`` seconds; by then every process it
    started has been stopped. Raises InterruptedError when ``cancel`` (a threading.Event) was set (the launch
    is stopped first).
    """
    from sprite.launch.execute import run_plan

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
