"""Read one of sprite's own records (a manifest, an audit trail, run.json, bench.json) as untrusted bytes.

Anyone who can write a run or checkpoint folder can put a FIFO, a device or a symlink where a record belongs, or
a file of gigabytes, or JSON nested 100,000 deep. :func:`read` opens without blocking (``O_NONBLOCK``: a FIFO
with no writer does not hang the open), without following a symlink, and reads only a regular file no larger
than the bound given; :func:`loads` turns Python's RecursionError on deep JSON into a ValueError. Both raise
only what callers already handle for a damaged file (OSError, ValueError). Stdlib only.

``sprite.contract.heartbeat`` keeps its own copy of these few lines: the contract imports nothing but errors.
"""

from __future__ import annotations

import errno
import json
import os
import stat

MANIFEST_MAX = 64 << 20  # a manifest lists each file in ~200 bytes: 300,000 files
AUDIT_MAX = 256 << 20  # an audit record is ~300-600 bytes: far more than a run writes
SUMMARY_MAX = 16 << 20  # run.json
REPORT_MAX = 64 << 20  # bench.json


def read(path, limit: int, follow: bool = False) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them; ``follow``: a symlink named by the user
    is followed (never for sprite's own records).

    Raises:
        OSError: missing or unreadable; a symlink (ELOOP) unless ``follow``; not a regular file (EINVAL: a FIFO,
            device or folder); larger than ``limit`` (EFBIG). ``strerror`` says which.
    """
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise OSError(errno.ELOOP, "it is a symlink, which sprite does not follow to its own records",
                          os.fspath(path)) from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(errno.EINVAL, "it is not a regular file (a FIFO, device or folder has its name)",
                          os.fspath(path))
        if info.st_size > limit:
            raise OSError(errno.EFBIG, f"it is larger than {limit} bytes ({info.st_size}), more than sprite ever"
                          " writes there", os.fspath(path))
        chunks, left = [], limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        if left <= 0:
            raise OSError(errno.EFBIG, f"it is larger than {limit} bytes (it grew while read)", os.fspath(path))
        return b"".join(chunks)
    finally:
        os.close(fd)


def loads(data: bytes | str):
    """``json.loads`` that raises ValueError (never RecursionError) for JSON nested too deep to parse."""
    try:
        return json.loads(data)
    except RecursionError:
        raise ValueError("it is JSON nested too deep") from None


def read_json(path, limit: int, follow: bool = False):
    """:func:`loads` of :func:`read`. Raises OSError as :func:`read`, ValueError for bytes that are not JSON."""
    return loads(read(path, limit, follow))
