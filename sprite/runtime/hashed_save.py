"""Lightning's single-file checkpoint write, with the SHA-256 computed while the bytes go to disk.

Lightning 2.6.6 serializes a checkpoint into memory and writes the bytes through an fsspec transaction
(fabric/utilities/cloud_io.py:85-117, called from fabric/plugins/io/torch_io.py:58). For a local path sprite
does the same write itself: a new temporary name beside the target (never through a symlink), fsync, then a
rename over the target as Lightning's transaction does, while a second thread hashes the same bytes
(``sprite.digest``, itself spread over threads; hashlib releases the GIL), so sealing the file later costs no
second read. Remote paths keep Lightning's own write.
"""

from __future__ import annotations

import io
import os
import secrets
import threading
from pathlib import Path

from sprite import digest
from sprite.writeonce import write_new

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
    buffer = io.BytesIO()
    torch.save(checkpoint, buffer)
    view = buffer.getbuffer()
    described: list[dict] = []
    hasher = threading.Thread(target=lambda: described.append(digest.buffer(view)), daemon=True)
    hasher.start()
    target = Path(text)
    temp = target.with_name(f".{target.name}.sprite-tmp-{secrets.token_hex(4)}")
    try:
        write_new(temp, view, mode=None)
        os.replace(temp, target)  # as Lightning's transaction commit does (fsspec LocalFileOpener.commit)
    finally:
        hasher.join()
        view.release()
        if os.path.lexists(temp):
            os.unlink(temp)
    info = os.stat(target, follow_symlinks=False)
    _WRITTEN[os.path.realpath(target)] = (info.st_size, info.st_mtime_ns, info.st_ino, described[0])


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
