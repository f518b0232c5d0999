"""The run folder: one new folder per ``sprite run`` holding ``audit.jsonl``, ``heartbeat/``, ``stacks/`` (with a
stall timeout) and ``run.json``.

It is never reused: ``--run-dir`` must name a folder that does not exist yet, and the default is a new name under
``./sprite-runs/``. The ranks find it in ``SPRITE_RUN_DIR``, so on a cluster it must be on a file system every
node sees (the working directory usually is).
"""

from __future__ import annotations

import json
import os
import secrets
import time
from pathlib import Path

from sprite.contract import heartbeat, stacks
from sprite.integrity import owner_only
from sprite.errors import UsageError
from sprite.integrity import IntegrityError, make_dir_new
from sprite.integrity.writeonce import replace_own

DEFAULT_PARENT = "sprite-runs"
AUDIT, HEARTBEATS, SUMMARY = "audit.jsonl", "heartbeat", "run.json"


def default_path(job_id: str = "", cwd: str | None = None, now: float | None = None) -> Path:
    """A fresh name under ``./sprite-runs/``: time, the scheduler's job id (if any) and a random suffix."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    job = "".join(c if c.isalnum() or c in "-_" else "_" for c in job_id.split(".")[0])
    name = "-".join(part for part in (stamp, job, secrets.token_hex(3)) if part)
    return Path(cwd or os.getcwd()) / DEFAULT_PARENT / name


def choose(run_dir: str | None, job_id: str = "") -> Path:
    """The absolute run folder path for ``--run-dir`` (or the default). Raises UsageError if it exists, or when
    ``--run-dir`` was given empty (a variable that expanded to nothing)."""
    if run_dir is not None and not run_dir.strip():
        raise UsageError("--run-dir was given an empty path.", "A shell variable in it expanded to nothing.",
                         "Pass a folder path, or leave --run-dir out for a new folder under ./sprite-runs/.")
    path = Path(run_dir).absolute() if run_dir else default_path(job_id)
    if os.path.lexists(path):
        raise UsageError(f"The run folder {path} exists already.", "sprite never writes into an existing run folder.",
                         "Pass a new --run-dir, or leave it out for a new folder under ./sprite-runs/.")
    return path


def create(path: Path) -> Path:
    """Create ``path`` (mode 0700 whatever the umask; missing parents 0700 too) and ``heartbeat/`` in it.

    Raises UsageError when it exists meanwhile or cannot be created.
    """
    try:
        owner_only.make_dirs(path.parent)
        make_dir_new(path, 0o700)
    except IntegrityError:
        raise UsageError(f"The run folder {path} exists already.", "Another run took the name.",
                         "Pass a new --run-dir.") from None
    except OSError as err:
        raise UsageError(f"Cannot create the run folder {path} ({err.strerror}).",
                         "The folder above it is not writable.", "Pass --run-dir on a writable file system.") from None
    make_dir_new(path / HEARTBEATS, 0o700)
    return path


def attempt_heartbeats(path: Path, attempt: int) -> Path:
    """Create and return the heartbeat folder of ``attempt``."""
    where = heartbeat.folder(path, attempt)
    make_dir_new(where, 0o700)
    return where


def attempt_stacks(path: Path, attempt: int) -> Path:
    """Create ``stacks/`` (once) and the stack folder of ``attempt`` in it; return the latter."""
    where = stacks.folder(path, attempt)
    if not where.parent.exists():
        make_dir_new(where.parent, 0o700)
    make_dir_new(where, 0o700)
    return where


def write_summary(path: Path, summary: dict) -> None:
    """Write ``run.json`` (sprite's own file in its own folder: replaced atomically on every update)."""
    replace_own(path / SUMMARY, (json.dumps(summary, indent=2, sort_keys=True) + "\n").encode())
