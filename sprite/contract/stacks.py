"""Stack files: where each rank was when it stopped advancing, written by the rank itself, read at a stall.

Every rank of a ``sprite run`` with a stall timeout keeps ``$SPRITE_RUN_DIR/stacks/attempt-N/rank<R>.txt`` open:
one header line (``HEADER`` + JSON: rank, host, pid, the folders that hold Python's and the installed packages'
code) and, once the rank has made no progress for the seconds ``SPRITE_STACKS_AFTER`` names, the Python stacks of
all its threads as ``faulthandler`` prints them. Beside it, ``rank<R>.collectives.json`` holds what torch's flight
recorder says of its last collectives (or why there is none). Both halves import this module: it imports nothing
heavy.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from sprite import contract

FOLDER = "stacks"
HEADER = "# sprite stacks "  # the first line of a stack file, then JSON
STACKS_MAX = 1 << 20  # bytes of a stack file read at most (faulthandler prints at most 100 frames a thread)
COLLECTIVES_MAX = 64 << 10
# torch's flight recorder keeps this many collectives per rank when the variable is set before the process group
# starts (TORCH_NCCL_TRACE_BUFFER_SIZE is its older name); seen recording gloo's collectives in torch 2.13.0 CPU
RECORDER_BUFFER, RECORDER_OLD_BUFFER, RECORDER_ENTRIES = "TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE", "2000"


def folder(run_dir: str | os.PathLike, attempt: int) -> Path:
    """The stack folder of one attempt of a run."""
    return Path(run_dir) / FOLDER / f"attempt-{attempt}"


def stacks_name(rank: int) -> str:
    return f"rank{rank}.txt"


def collectives_name(rank: int) -> str:
    return f"rank{rank}.collectives.json"


@dataclass(frozen=True)
class After:
    """Seconds without progress after which a rank dumps its stacks: in a training step (and in general),
    before its first training step, in a checkpoint save (the watchdog's three limits, less a margin)."""

    stall: float
    first_step: float
    save: float

    def value(self) -> str:
        # 15 digits: ":g" keeps 6, and rounds a dump time of 315359940 s up to the limit itself (3.1536e+08)
        return f"{self.stall:.15g},{self.first_step:.15g},{self.save:.15g}"

    @classmethod
    def parse(cls, text: str) -> After | None:
        """The After in ``SPRITE_STACKS_AFTER``'s value, None when it is not three positive numbers."""
        try:
            numbers = [float(part) for part in text.split(",")]
        except ValueError:
            return None
        # 1e9 is above every time the plan gives: the watchdog's limits are at most ten years (3.15e8 s, Limits)
        if len(numbers) != 3 or not all(0 < n < 1e9 for n in numbers):  # NaN fails both comparisons
            return None
        return cls(*numbers)


def from_env(env) -> tuple[Path, After] | None:
    """This rank's stack folder and dump times from the launch contract, None when the launch asked for none."""
    run_dir, attempt = env.get(contract.RUN_DIR, ""), env.get(contract.ATTEMPT, "")
    after = After.parse(env.get(contract.STACKS_AFTER, ""))
    if not run_dir or not (attempt.isascii() and attempt.isdigit()) or after is None:
        return None
    return folder(run_dir, int(attempt)), after


def read(path: Path, limit: int) -> bytes | None:
    """The first ``limit`` bytes of the regular file ``path`` (never through a symlink; a FIFO does not block),
    or None when it is missing or not a regular file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        chunks, left = [], limit
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 16))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    except OSError:
        return None
    finally:
        os.close(fd)
