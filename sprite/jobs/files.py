"""The one writer of the files a submission leaves for the user: the output folder and the job script.

Every submission gets a new name, ``<job_name>-<n>`` for its script and log (n = 1, 2, ... the first unused),
created with ``integrity.write_new`` (O_CREAT|O_EXCL|O_NOFOLLOW, 0600) in folders made 0700 when missing
(``sprite.integrity.owner_only``'s rule): an existing file or a symlink is never replaced, followed or chmodded.
``Written.undo`` removes exactly what this submission created.
"""

from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass, field

from sprite.errors import UsageError, one_line
from sprite.integrity import IntegrityError, make_dir_new, write_new
from sprite.launch import folders

MAX_TRIES = 10_000


@dataclass
class Written:
    """What one submission created: folders (outermost first) and the script (with its inode)."""

    folders: list = field(default_factory=list)
    script: str | None = None
    inode: tuple | None = None

    def undo(self) -> None:
        """Remove the script and the folders this submission created (folders only while empty)."""
        if self.script and self.inode:
            info = os.lstat(self.script) if os.path.lexists(self.script) else None
            if info and (info.st_dev, info.st_ino) == self.inode:
                os.unlink(self.script)
        for folder in reversed(self.folders):
            try:
                os.rmdir(folder)
            except OSError:
                break  # someone put something there meanwhile: it stays


def _refuse(folder: str, what: str, fix: str = "") -> UsageError:
    return UsageError(f"The job's output folder {one_line(folder, 300)} {what}.",
                      "It comes from scheduler.output_dir in the spec (default: ./sprite-jobs).",
                      fix or "Set scheduler.output_dir to a folder you can write to.")


def check_output_folder(folder: str) -> None:
    """Refuse ``folder`` before anything is written (``sprite.launch.folders.problem``): a file in the way, a
    folder that cannot be made or written, a kernel file system. The dry run checks it too. Raises UsageError."""
    why = folders.problem(folder)
    if why:
        raise _refuse(folder, why)


def output_folder(folder: str, written: Written) -> None:
    """Create ``folder`` (and missing parents) unless it exists, after ``check_output_folder``. Records what it
    created in ``written``. Raises UsageError."""
    check_output_folder(folder)
    missing, parent = [], folder
    while not os.path.lexists(parent):
        missing.append(parent)
        parent = os.path.dirname(parent)
    for path in reversed(missing):
        try:
            make_dir_new(path)  # 0700 whatever the umask
        except (OSError, IntegrityError) as err:
            written.undo()
            raise _refuse(folder, f"cannot be made ({getattr(err, 'strerror', None) or 'it appeared meanwhile'})"
                          ) from None
        written.folders.append(path)
    if not os.access(folder, os.W_OK | os.X_OK):
        written.undo()
        raise _refuse(folder, "is not writable for you")


def free_stem(job_name: str, paths) -> str:
    """The first ``<job_name>-<n>`` none of whose files (``paths(stem)``) exist. A name holding %, which the
    scheduler fills in (``train-1-%j.log``), is taken when any file matches it with each % field as ``*``, so a
    log left from an earlier job keeps its number from being reused. Raises UsageError after MAX_TRIES names."""
    for number in range(1, MAX_TRIES + 1):
        stem = f"{job_name}-{number}"
        if not any(_taken(path) for path in paths(stem)):
            return stem
    raise UsageError(f"{MAX_TRIES} job scripts named {job_name}-<n> exist already.", "",
                     "Clean up the output folder or set scheduler.job_name.")


def _taken(path: str) -> bool:
    if "%" not in path:
        return os.path.lexists(path)
    return bool(glob.glob(re.sub(r"%[^/]", "*", glob.escape(path))))


def write_script(path: str, text: str, written: Written) -> bool:
    """Create the job script ``path`` (0600). Returns False when the name is taken (pick another).
    Raises UsageError when the folder refuses the file."""
    try:
        write_new(path, text.encode())
    except IntegrityError:
        return False
    except OSError as err:
        raise UsageError(f"Cannot write the job script {one_line(path, 300)} ({err.strerror}).",
                         "The output folder is full, read-only or not yours.",
                         "Set scheduler.output_dir to a folder you can write to.") from None
    info = os.lstat(path)
    written.script, written.inode = path, (info.st_dev, info.st_ino)
    return True
