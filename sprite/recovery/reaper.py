"""Nothing of a launch outlives it: find every process below sprite and kill what the launch left behind.

sprite becomes a child subreaper (Linux ``PR_SET_CHILD_SUBREAPER``), so a rank or launcher helper that outlives
its parent (MPICH Hydra starts its proxy and every rank in a session of their own) is re-parented to sprite instead
of init, where ``sweep`` finds it, kills it and reaps it.
"""

from __future__ import annotations

import ctypes
import os
import signal
from pathlib import Path

_PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> None:
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1)
    except OSError:  # not Linux: the launcher's own process group is what gets cleaned up
        pass


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (Linux /proc), children before grandchildren."""
    found, queue = [], [pid]
    while queue:
        parent = queue.pop(0)
        for task in Path(f"/proc/{parent}/task").glob("*"):
            try:
                kids = [int(k) for k in (task / "children").read_text().split()]
            except OSError:
                continue
            found += kids
            queue += kids
    return found


def sweep(spared: set[int]) -> list[int]:
    """SIGKILL and reap every process below this one that is not below one of ``spared`` (this process's
    children from before the launch); returns their pids."""
    keep = set(spared) | {pid for child in spared for pid in descendants(child)}
    left = [pid for pid in descendants(os.getpid()) if pid not in keep]
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for pid in left:
        try:
            os.waitpid(pid, 0)  # only our own children (re-parented orphans) can be reaped; others are the kernel's
        except ChildProcessError:
            pass
    return left
