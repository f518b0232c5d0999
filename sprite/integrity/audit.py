"""An append-only JSONL audit trail in which every record carries the SHA-256 of the line before it. Stdlib only.

Each line is one canonical JSON record (``sprite.integrity.canonical``): the caller's fields plus ``kind``, ``time`` (UTC,
ISO 8601), ``seq`` (0, 1, 2, ...), ``prev`` (the SHA-256 of the previous line's bytes, or ``GENESIS`` for the
first) and ``self_sha256`` (the digest of the line's own content). Appends take an exclusive ``flock`` and write
one whole line with ``O_APPEND``, then fsync, so concurrent writers never interleave or fork the chain.

What :func:`verify` detects: an edited line (any single changed byte: its own digest, the canonical form or the
next line's ``prev`` no longer match), a reordered, inserted, duplicated or removed line in the middle (``prev``
and ``seq`` break), a line cut short (no newline). What it cannot detect from the file alone: removing whole lines
from the end, which leaves a shorter trail that is itself valid. sprite stores no record count beside the trail
(whoever could remove lines could edit the count too); a caller that needs to notice a shortened trail keeps the
``self_sha256`` of the last record that :func:`append` returned and compares it with the last record read later.
"""

from __future__ import annotations

import datetime
import fcntl
import hashlib
import os
import stat

from sprite.integrity import canonical, records
from sprite.integrity.writeonce import IntegrityError, write_new

GENESIS = "0" * 64  # ``prev`` of the first record
RESERVED = ("kind", "time", "seq", "prev", canonical.SELF)
_TAIL = 1 << 16


def _open(path) -> int:
    """A descriptor for appending to ``path``, which is created 0600 if missing. Raises IntegrityError if it is
    a symlink or not a regular file."""
    try:
        write_new(path, b"", 0o600)
    except IntegrityError:
        pass  # it exists: append to it if it is a regular file (O_NOFOLLOW refuses a symlink)
    try:
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as err:
        raise IntegrityError(f"Cannot append to the audit trail {path}: {err.strerror}.", "It is a symlink or"
                             " not writable.", "Point the run folder at a folder sprite created.") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise IntegrityError(f"The audit trail {path} is not a regular file.", "Something else has its name.",
                             "Point the run folder at a folder sprite created.")
    return fd


def _last_line(fd: int) -> bytes:
    """The last line of the open file without its newline, b"" for an empty file. Raises IntegrityError if the
    file does not end with a newline (a torn append)."""
    size = os.fstat(fd).st_size
    if size == 0:
        return b""
    tail, start = b"", size
    while start > 0 and tail.count(b"\n") < 2:
        start = max(0, start - _TAIL)
        tail = os.pread(fd, size - start, start)
    if not tail.endswith(b"\n"):
        raise IntegrityError("The audit trail ends in an incomplete line.", "A write was cut short (the machine or"
                             " file system failed during an append).", "Keep the file as evidence; start a new run"
                             " folder.")
    return tail[:-1].rsplit(b"\n", 1)[-1]


def append(path, kind: str, /, **fields) -> dict:
    """Append one record, fsync, and return it as written (with ``time``, ``seq``, ``prev`` and ``self_sha256``).

    Raises:
        ValueError: a field uses a reserved name or a value JSON cannot hold.
        IntegrityError: the trail is not a regular file, or its last line is torn or not a sprite record.
    """
    clash = sorted(set(fields) & set(RESERVED))
    if clash:
        raise ValueError(f"audit field names {clash} are reserved")
    fd = _open(path)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        last = _last_line(fd)
        try:
            seq = canonical.unseal(last, one_line=True)["seq"] + 1 if last else 0
        except (ValueError, KeyError, TypeError) as err:
            raise IntegrityError(f"The last line of the audit trail {path} is not a sprite record ({err}).",
                                 "The file was edited.", "Keep the file as evidence; start a new run folder.")
        time = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="microseconds")
        record = {**fields, "kind": kind, "time": time, "seq": seq,
                  "prev": hashlib.sha256(last).hexdigest() if last else GENESIS}
        line = canonical.sealed(record, one_line=True)
        os.write(fd, line + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)  # closing releases the lock
    return {**record, canonical.SELF: canonical.digest(record)}


def read(path) -> list[dict]:
    """Every record as :func:`append` returned it, in order, without checking the chain (:func:`verify` does).

    Raises:
        IntegrityError: a line is not a sprite record or the last one is incomplete. OSError: unreadable file.
    """
    lines, torn = _lines(path)
    records = []
    for number, line in enumerate(lines, 1):
        try:
            if torn and number == len(lines):
                raise ValueError("it is incomplete (no newline at the end)")
            record = canonical.unseal(line, one_line=True)
            records.append({**record, canonical.SELF: canonical.digest(record)})
        except ValueError as err:
            raise IntegrityError(f"Line {number} of the audit trail {path} is not a sprite record: {err}.",
                                 "The file was edited or damaged.", "Run `sprite runs verify` to see where.")
    return records


def _lines(path) -> tuple[list[bytes], bool]:
    """The lines without their newlines, and whether the last one had none (a torn append). Raises OSError as
    ``records.read``: a symlink, a FIFO or a trail over ``records.AUDIT_MAX`` bytes is refused unread."""
    data = records.read(path, records.AUDIT_MAX)
    lines = data.split(b"\n")
    torn = bool(lines[-1])
    return (lines if torn else lines[:-1]), torn


def verify(path) -> tuple[bool, str]:
    """``(True, "N records")`` for an intact trail, else ``(False, reason)`` naming the first bad line.

    Never raises: an unreadable file is a reason too.
    """
    try:
        lines, torn = _lines(path)
    except OSError as err:
        return False, f"cannot read {path}: {err.strerror or err}"
    prev = GENESIS
    for number, line in enumerate(lines, 1):
        if torn and number == len(lines):
            return False, f"line {number}: incomplete (no newline at the end)"
        try:
            record = canonical.unseal(line, one_line=True)
        except ValueError as err:
            return False, f"line {number}: {err}"
        if record.get("prev") != prev:
            where = f"line {number - 1}" if number > 1 else "the genesis value"
            return False, f"line {number}: prev does not match {where} (a line was edited, removed, inserted or" \
                          " reordered)"
        if record.get("seq") != number - 1:
            return False, f"line {number}: seq is {record.get('seq')!r}, expected {number - 1}"
        prev = hashlib.sha256(line).hexdigest()
    return True, f"{len(lines)} records"
