"""Create files and folders that must not exist yet, durably, never through a symlink; hash files. Stdlib only.

The rule behind every output sprite writes: a name is created once (``O_CREAT | O_EXCL``, which also refuses a
symlink, even a dangling one), given its mode whatever the umask, written and fsynced. Nothing here replaces,
truncates, chmods or follows a symlink to a file that this call did not create.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets

from sprite.errors import SpriteError


class IntegrityError(SpriteError):
    """A file sprite must create exists already, or a sealed target does not match its manifest (exit 1)."""


def exists_error(path, what: str) -> IntegrityError:
    return IntegrityError(f"{path} already exists (or is a symlink); refusing to write {what} over it.",
                          "An earlier run or another process used this name.",
                          "Choose a new output name or move the old one away.")


def write_new(path, data: bytes, mode: int | None = 0o600, sync: bool = True) -> None:
    """Create ``path`` (it must not exist, not even as a symlink) with ``mode`` whatever the umask (``None``: the
    usual 0666 less the umask), write, fsync (unless ``sync`` is False: the caller sees to it).

    Raises:
        IntegrityError: the path exists or is a symlink. OSError for any other failure (the partial file is
            removed, since this call created it).
    """
    with created(path, mode, sync=sync) as fd:
        write_all(fd, data)


def replace_own(path, data: bytes, mode: int = 0o600) -> None:
    """Replace ``path``, a file sprite keeps up to date in a folder of its own (run.json, a heartbeat), atomically:
    ``data`` goes to a new file of a random name beside it (never through a symlink), renamed over ``path``. A
    failure removes that new file and leaves ``path`` as it was. Not fsynced. Raises OSError."""
    path = os.fspath(path)
    folder, name = os.path.split(path)
    temporary = os.path.join(folder, f".{name}.{secrets.token_hex(6)}.tmp")
    write_new(temporary, data, mode, sync=False)
    try:
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


@contextlib.contextmanager
def created(path, mode: int | None = 0o600, readable: bool = False, sync: bool = True):
    """``with created(path) as fd:`` write into a file this call creates as :func:`write_new` does (``readable``:
    open it for reading too); fsynced (unless ``sync`` is False: the caller sees to it) and closed at the end of
    the block, removed if the block raises.

    Raises:
        IntegrityError: the path exists or is a symlink. OSError for any other failure.
    """
    flags = (os.O_RDWR if readable else os.O_WRONLY) | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o666 if mode is None else mode)
    except FileExistsError:
        raise exists_error(path, "a file") from None
    try:
        if mode is not None:
            os.fchmod(fd, mode)  # the umask may have removed bits from ``mode``
        yield fd
        if sync:
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(path)
        raise
    os.close(fd)


def write_all(fd: int, data) -> None:
    """Write every byte of ``data`` to ``fd`` (os.write may take only part of it). Raises OSError."""
    view = memoryview(data).cast("B")
    while view:
        view = view[os.write(fd, view):]


def _fsync(path, flags: int) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | flags)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path) -> None:
    """Make the entries of folder ``path`` durable (new names, links, removals). Raises OSError."""
    _fsync(path, os.O_DIRECTORY)


def make_dir_new(path, mode: int = 0o700) -> None:
    """Create folder ``path`` with ``mode`` whatever the umask, and make its name durable; the parent must exist.

    Raises:
        IntegrityError: the path exists (a folder, a file or a symlink). OSError for any other failure.
    """
    try:
        os.mkdir(path, mode)
    except FileExistsError:
        raise exists_error(path, "a folder") from None
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.fchmod(fd, mode)
    finally:
        os.close(fd)
    fsync_dir(os.path.dirname(os.path.abspath(path)))


def fsync_file(path) -> None:
    """Flush a regular file's data to stable storage (never through a symlink). Raises OSError."""
    _fsync(path, os.O_NOFOLLOW)


def sha256_file(path) -> str:
    """The SHA-256 hex digest of a regular file, read in chunks (never through a symlink). Raises OSError."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as handle:
        file_digest = getattr(hashlib, "file_digest", None)  # Python 3.11+
        if file_digest is not None:
            return file_digest(handle, "sha256").hexdigest()
        sha = hashlib.sha256()  # Python 3.10, which pyproject.toml allows
        for block in iter(lambda: handle.read(1 << 20), b""):
            sha.update(block)
        return sha.hexdigest()
