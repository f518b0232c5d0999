"""Lightning's single-file checkpoint write, with the SHA-256 computed while the bytes go to disk.

Lightning 2.6.6 serializes a checkpoint into memory and writes the bytes through an fsspec transaction
(fabric/utilities/cloud_io.py:85-117, called from fabric/plugins/io/torch_io.py:58). For a local path sprite
has ``torch.save`` write straight into a new temporary name beside the target (never through a symlink), each
64 MiB piece of the bytes going on to a pool of threads that hashes it (``sprite.digest.Stream``), then fsyncs
and renames over the target as Lightning's transaction does. Sealing the file later costs no second read, and
the checkpoint is never held whole in memory a second time. Remote paths keep Lightning's own write.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from sprite import digest
from sprite.writeonce import created, write_all

# realpath -> (size, mtime_ns, inode, sprite.digest entry) of files this process wrote and hashed in one pass
_WRITTEN: dict[str, tuple[int, int, int, dict]] = {}


def atomic_save(checkpoint: dict, filepath) -> None:
    """Serialize ``checkpoint`` with ``torch.save`` and put it at ``filepath`` whole or not at all.

    Raises:
        OSError: the write, fsync or rename failed (the temporary file is removed).
    """
    import torch

    text = os.fspath(filepath)
    if "://" in text:
        return _lightning_atomic_save(checkpoint, filepath)
    target = Path(text)
    temp = target.with_name(f".{target.name}.sprite-tmp-{secrets.token_hex(4)}")
    try:
        with digest.Stream() as stream, created(temp, mode=None) as fd:
            torch.save(checkpoint, _Tee(fd, stream))
            entry = stream.entry()
        os.replace(temp, target)  # as Lightning's transaction commit does (fsspec LocalFileOpener.commit)
    finally:
        if os.path.lexists(temp):
            os.unlink(temp)
    info = os.stat(target, follow_symlinks=False)
    _WRITTEN[os.path.realpath(target)] = (info.st_size, info.st_mtime_ns, info.st_ino, entry)


class _Tee:
    """The file object ``torch.save`` writes into (it only writes, in order, and flushes)."""

    def __init__(self, fd: int, stream: digest.Stream) -> None:
        self.fd, self.stream = fd, stream

    def write(self, data) -> int:
        write_all(self.fd, data)
        self.stream.feed(data)
        return memoryview(data).nbytes

    def flush(self) -> None:
        pass


def known_entry(path) -> dict | None:
    """The manifest entry (``sprite.digest``) this process computed while writing ``path``, if the file is still
    exactly that file."""
    entry = _WRITTEN.get(os.path.realpath(path))
    try:
        info = os.stat(path, follow_symlinks=False)
    except OSError:
        return None
    if entry is None or entry[:3] != (info.st_size, info.st_mtime_ns, info.st_ino):
        return None
    return entry[3]


def _lightning_atomic_save(checkpoint, filepath) -> None:
    from lightning.fabric.utilities.cloud_io import _atomic_save

    _atomic_save(checkpoint, filepath)


def install() -> None:
    """Route TorchCheckpointIO's writes through :func:`atomic_save` (idempotent)."""
    from lightning.fabric.plugins.io import torch_io

    torch_io._atomic_save = atomic_save
