"""Lightning's checkpoint writes, hashed as they are written and made durable off the training loop's path.

Single file: Lightning 2.6.6 serializes a checkpoint into memory and writes the bytes through an fsspec
transaction (fabric/utilities/cloud_io.py:85-117, called from fabric/plugins/io/torch_io.py:58). For a local path
sprite has ``torch.save`` write straight into a new temporary name beside the target (never through a symlink; no
copy of the checkpoint in memory), hashes the file's 64 MiB pieces on a pool of threads from the page cache
(``sprite.integrity.digest.open_file``) and renames it to the target as Lightning's transaction does. A file that replaces
one of the same name is fsynced first, by one more thread while the others hash; a new name is fsynced in the
background (``sprite.runtime.ckpt.durable``). Sealing the file later costs no second read. Remote paths keep
Lightning's own write.

Sharded folder: Lightning's ``torch.distributed.checkpoint.save`` (fabric/strategies/fsdp.py:860, imported by
pytorch/strategies/model_parallel.py and fsdp.py) infers a ``FileSystemWriter`` that writes each rank's shards on
one thread and fsyncs every file. sprite's writer (``sprite.runtime.ckpt.dcp_write``) writes each rank's one shard file
without a ``torch.save`` per tensor, hashes its 64 MiB pieces while the file is still being written
(``sprite.integrity.digest.Growing``), so the seal reads none of them again, and leaves the fsync to
``sprite.runtime.ckpt.seal``, which does it in the background for a new folder.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from sprite.integrity import digest
from sprite.runtime.ckpt import durable
from sprite.runtime.ckpt.gcpause import paused_gc
from sprite.integrity.writeonce import created

# realpath -> (size, mtime_ns, inode, sprite.integrity.digest entry, whether its fsync is seen to) of files this process
# wrote and hashed in one pass
_WRITTEN: dict[str, tuple[int, int, int, dict, bool]] = {}


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
    replacing, keep = os.path.lexists(target), None
    try:
        with created(temp, mode=None, readable=True, sync=False) as fd:
            with os.fdopen(os.dup(fd), "wb") as out, paused_gc():  # torch.save's writer for any file object
                torch.save(checkpoint, out)
            entry = digest.open_file(fd, beside=(lambda: os.fsync(fd)) if replacing else None)
            keep = None if replacing else os.dup(fd)
        with durable.LOCK:
            os.replace(temp, target)  # as Lightning's transaction commit does (fsspec LocalFileOpener.commit)
    except BaseException:
        if keep is not None:
            os.close(keep)
        raise
    finally:
        if os.path.lexists(temp):
            os.unlink(temp)
    if keep is not None:
        durable.fsync_later(keep)
    _remember(target, entry, fsync_seen_to=True)


def _remember(path, entry: dict, fsync_seen_to: bool) -> None:
    info = os.stat(path, follow_symlinks=False)
    _WRITTEN[os.path.realpath(path)] = (info.st_size, info.st_mtime_ns, info.st_ino, entry, fsync_seen_to)


def _known(path) -> tuple | None:
    entry = _WRITTEN.get(os.path.realpath(path))
    try:
        info = os.stat(path, follow_symlinks=False)
    except OSError:
        return None
    if entry is None or entry[:3] != (info.st_size, info.st_mtime_ns, info.st_ino):
        return None
    return entry


def known_entry(path) -> dict | None:
    """The manifest entry (``sprite.integrity.digest``) this process computed while writing ``path``, if the file is still
    exactly that file."""
    entry = _known(path)
    return entry[3] if entry else None


def fsync_seen_to(path) -> bool:
    """Whether the write of ``path`` (one :func:`known_entry` knows) also fsynced it or queued its fsync."""
    entry = _known(path)
    return bool(entry and entry[4])


def _lightning_atomic_save(checkpoint, filepath) -> None:
    from lightning.fabric.utilities.cloud_io import _atomic_save

    _atomic_save(checkpoint, filepath)


def dcp_save(converted_state: dict, path) -> None:
    """Lightning's ``_distributed_checkpoint_save`` with sprite's writer (``sprite.runtime.ckpt.dcp_write``): one new
    shard file a rank, hashed while it is written, no fsync (the seal sees to it). Every rank calls it, as
    Lightning does."""
    from torch.distributed.checkpoint import save

    from sprite.runtime.ckpt.dcp_write import Writer

    writer = Writer(path)
    with paused_gc():
        save(converted_state, storage_writer=writer)
    for name, entry in writer.entries.items():
        _remember(name, entry, fsync_seen_to=False)


def install() -> None:
    """Route TorchCheckpointIO's writes through :func:`atomic_save` and Lightning's sharded saves through
    :func:`dcp_save` (idempotent)."""
    from lightning.fabric.plugins.io import torch_io
    from lightning.pytorch.strategies import fsdp, model_parallel

    torch_io._atomic_save = atomic_save
    model_parallel._distributed_checkpoint_save = dcp_save
    fsdp._distributed_checkpoint_save = dcp_save
