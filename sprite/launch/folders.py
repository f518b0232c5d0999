"""Whether a folder sprite is asked to make (``--run-dir``, ``--log-dir``, ``scheduler.output_dir``) can be made
and used, answered before anything is created: a run that would fail half-way must fail here, leaving nothing.

Pure reads of the file system (``lstat``, ``access``); nothing is created, changed or followed past a name.
"""

from __future__ import annotations

import os

from sprite.errors import one_line
from sprite.values.grammar import control_char

KERNEL_FS = ("/proc", "/sys", "/dev")  # never a place for a run's files, even where root could create them


def problem(folder: str) -> str | None:
    """Why ``folder`` cannot be made or written into, as the end of a sentence; None when it can.

    Refused: a control character in the path, a path under a kernel file system, a file (or a dangling link)
    where the folder or a parent folder should be, and a nearest existing folder that is not writable for you.
    """
    bad = control_char(folder)
    if bad:
        return f"holds the control character {bad!r}"
    real = os.path.realpath(folder)
    kernel = next((top for top in KERNEL_FS if real == top or real.startswith(top + "/")), None)
    if kernel:
        return f"is under {kernel}, a kernel file system"
    parent = folder  # the folder itself, else the nearest of its parents that exists
    while not os.path.lexists(parent):
        parent = os.path.dirname(parent) or "."
    if not os.path.isdir(parent):
        return f"cannot be made: {one_line(parent, 300)} is a file, not a folder"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"cannot be made or written: {one_line(parent, 300)} is not writable for you"
    return None
