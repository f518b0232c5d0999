"""Heartbeat files: each rank's last known step and phase, written by the runtime, read by the stall watchdog.

One small JSON file per rank in ``$SPRITE_RUN_DIR/heartbeat/attempt-N/``, replaced atomically (write a temporary
name, then ``os.replace``), so a reader never sees half a file and no rank waits for another. Both halves import
this module: it imports nothing heavy.
"""

from __future__ import annotations

import json
import os
import secrets
import stat
from dataclasses import asdict, dataclass
from pathlib import Path

from sprite import contract

# What a rank is doing, in the order a fit goes through them.
START, TRAINING, VALIDATION, SAVE, DONE = "start", "training step", "validation", "checkpoint save", "done"
PREEMPTED = "preempted"  # saved a checkpoint after the preemption signal and stopped (exit 75)
FAILED = "failed"  # the script raised or exited non-zero: this rank is leaving, its error is in its output
PHASES = (START, TRAINING, VALIDATION, SAVE, DONE, PREEMPTED, FAILED)
ENDED = (DONE, PREEMPTED, FAILED)  # the script has returned or stopped: no progress comes after these


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
    time: float  # the rank's wall clock at its last progress (not at leaving); the watchdog uses its own clock
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
    # A new file of a random name (never through a symlink), renamed over the old beat; removed if that fails.
    # (sprite.integrity.writeonce.replace_own does the same for the launcher half; contract may not import it.)
    temporary = where / f".rank{beat.rank}.{secrets.token_hex(6)}.tmp"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        with os.fdopen(fd, "w") as out:
            out.write(json.dumps(asdict(beat)))
        os.replace(temporary, where / f"rank{beat.rank}.json")
    except BaseException:
        if os.path.lexists(temporary):
            os.unlink(temporary)
        raise


BEAT_MAX = 64 << 10  # bytes of one heartbeat file read at most (a beat is about 150)
_TYPES = {"rank": int, "host": str, "pid": int, "step": int, "phase": str, "count": int, "time": float,
          "first_step": int}


def read_all(where: Path) -> dict[int, Beat]:
    """Every readable heartbeat in ``where`` by rank; a missing folder or a malformed file is skipped (a symlink,
    a FIFO, a file over ``BEAT_MAX`` bytes, JSON of another shape or with a field of the wrong type): a bad beat
    never stops the watchdog."""
    beats: dict[int, Beat] = {}
    try:
        names = [entry.name for entry in os.scandir(where)]
    except OSError:
        return beats
    for name in names:
        if not (name.startswith("rank") and name.endswith(".json")):
            continue
        beat = parse(_read(where / name))
        if beat is not None:
            beats[beat.rank] = beat
    return beats


def parse(data: bytes | None) -> Beat | None:
    """The Beat in ``data`` (a heartbeat file's bytes), or None when it is not one: not JSON (or nested too
    deep), not an object, an unknown or missing field, a field of the wrong type, a negative rank."""
    try:
        fields = json.loads(data) if data is not None else None
    except (ValueError, RecursionError):
        return None
    if not isinstance(fields, dict) or not set(_TYPES) - {"first_step"} <= set(fields) <= set(_TYPES):
        return None
    for key, value in fields.items():
        kind = (int, float) if _TYPES[key] is float else _TYPES[key]
        if isinstance(value, bool) or not isinstance(value, kind):
            return None
    if fields["rank"] < 0 or fields["time"] != fields["time"]:  # NaN is no time
        return None
    return Beat(**fields)


def _read(path: Path) -> bytes | None:
    """The bytes of the regular file ``path`` (never a symlink; a FIFO does not block), or None. The contract
    imports nothing but errors, so this is sprite.integrity.records.read's rule in a few lines."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > BEAT_MAX:
            return None
        data = os.read(fd, BEAT_MAX + 1)
        return data if len(data) <= BEAT_MAX else None
    except OSError:
        return None
    finally:
        os.close(fd)
