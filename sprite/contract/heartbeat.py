"""Heartbeat files: each rank's last known step and phase, written by the runtime, read by the stall watchdog.

One small JSON file per rank in ``$SPRITE_RUN_DIR/heartbeat/attempt-N/``, replaced atomically (write a temporary
name, then ``os.replace``), so a reader never sees half a file and no rank waits for another. Both halves import
this module: it imports nothing heavy.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from sprite import contract

# What a rank is doing, in the order a fit goes through them.
START, TRAINING, VALIDATION, SAVE, DONE = "start", "training step", "validation", "checkpoint save", "done"
PREEMPTED = "preempted"  # saved a checkpoint after the preemption signal and stopped (exit 75)
PHASES = (START, TRAINING, VALIDATION, SAVE, DONE, PREEMPTED)


@dataclass(frozen=True)
class Beat:
    """One rank's state. ``count`` grows with every step, validation batch and phase change: progress.
    ``first_step`` is the global step this process started training at (-1 before its first training step)."""

    rank: int
    host: str
    pid: int
    step: int
    phase: str
    count: int
    time: float  # the rank's wall clock; the watchdog measures stalls on its own clock
    first_step: int = -1

    @property
    def past_first_step(self) -> bool:
        return 0 <= self.first_step < self.step


def folder(run_dir: str | os.PathLike, attempt: int) -> Path:
    """The heartbeat folder of one attempt of a run."""
    return Path(run_dir) / "heartbeat" / f"attempt-{attempt}"


def folder_from_env(env) -> Path | None:
    """This rank's heartbeat folder from the launch contract (``SPRITE_RUN_DIR`` and ``SPRITE_ATTEMPT``, both set
    by ``sprite run``), or None when the launch asked for none."""
    run_dir, attempt = env.get(contract.RUN_DIR, ""), env.get(contract.ATTEMPT, "")
    if not run_dir or not (attempt.isascii() and attempt.isdigit()):  # "²".isdigit() is True, int() refuses it
        return None
    return folder(run_dir, int(attempt))


def write(where: Path, beat: Beat) -> None:
    """Replace ``rank<N>.json`` in ``where`` with ``beat``. Raises OSError when the folder is not writable."""
    final = where / f"rank{beat.rank}.json"
    temporary = where / f".rank{beat.rank}.{beat.pid}.tmp"
    with open(temporary, "w") as out:
        out.write(json.dumps(asdict(beat)))
    os.replace(temporary, final)


def read_all(where: Path) -> dict[int, Beat]:
    """Every readable heartbeat in ``where`` by rank; a missing folder or a malformed file is skipped."""
    beats: dict[int, Beat] = {}
    try:
        names = [entry.name for entry in os.scandir(where)]
    except OSError:
        return beats
    for name in names:
        if not (name.startswith("rank") and name.endswith(".json")):
            continue
        try:
            beat = Beat(**json.loads((where / name).read_text()))
        except (OSError, ValueError, TypeError):
            continue
        beats[beat.rank] = beat
    return beats
