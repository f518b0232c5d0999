"""Owner-only outputs: the folders and logs sprite creates are 0700 and 0600 whatever the umask.

Job scripts, their output folder, run folders, logs and results may hold environment values or a job's
details, and project folders are often readable by a whole group. New files go through
``sprite.integrity.write_new`` (0600) and new folders through ``make_dir_new`` (0700); what exists already is
used as it is, never chmodded, and a log is never opened through a symlink. Stdlib only.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from sprite.integrity import IntegrityError, make_dir_new, write_new


def make_dirs(path) -> None:
    """Create every missing folder of ``path`` (parents first), each 0700; existing folders are left as they are.

    Raises IntegrityError when a component exists but is not a folder; OSError for any other failure.
    """
    path = Path(os.path.abspath(path))
    missing = []
    while not path.is_dir():
        missing.append(path)
        path = path.parent
    for folder in reversed(missing):
        try:
            make_dir_new(folder)
        except IntegrityError:
            if not folder.is_dir():  # another process may have made it in between; anything else is refused
                raise


def open_log(path):
    """``path`` opened for appending (binary). A new log is created 0600; an existing regular file is appended to.

    Raises OSError (ELOOP) when ``path`` is a symlink, (EINVAL) when it is not a regular file (a FIFO would block
    the open until something read it), or for any other failure to open it.
    """
    if not os.path.lexists(path):
        try:
            write_new(path, b"")
        except IntegrityError:
            pass  # created by another process in between: append to it like to any existing log
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as err:
        if err.errno != errno.ENXIO:  # ENXIO: a FIFO no process reads
            raise
        raise OSError(errno.EINVAL, "not a regular file", str(path)) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file", str(path))
    os.set_blocking(fd, True)
    return os.fdopen(fd, "ab")
