"""Lightning's single-file checkpoint write, with the SHA-256 computed while the file is fsynced.

Lightning 2.6.6 serializes a checkpoint into memory and writes the bytes through an fsspec transaction
(fabric/utilities/cloud_io.py:85-117, called from fabric/plugins/io/torch_io.py:58). For a local path sprite
has ``torch.save`` write straight into a new temporary name beside the target (never through a symlink; no copy
of the checkpoint in memory), then hashes the file's 64 MiB pieces on a pool of threads from the page cache
while one more thread fsyncs it (``sprite.digest.open_file``), and renames it over the target as Lightning's
transaction does. Sealing the file later costs no second read. Remote paths keep Lightning's own write.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from sprite import digest
from sprite.writeonce import created

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
        with created(temp, mode=None, readable=True) as fd:
            with os.fdopen(os.dup(fd), "wb") as out:  # the same writer torch.save uses for any file object
                torch.save(checkpoint, out)
            entry = digest.open_file(fd, beside=lambda: os.fsync(fd))
        os.replace(temp, target)  # as Lightning's transaction commit does (fsspec LocalFileOpener.commit)
    finally:
        if os.path.lexists(temp):
            os.unlink(temp)
    info = os.stat(target, follow_symlinks=False)
    _WRITTEN[os.path.realpath(target)] = (info.st_size, info.st_mtime_ns, info.st_ino, entry)


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
