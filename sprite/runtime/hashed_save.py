"""Lightning's checkpoint writes, hashed as they are written and made durable off the training loop's path.

Single file: Lightning 2.6.6 serializes a checkpoint into memory and writes the bytes through an fsspec
transaction (fabric/utilities/cloud_io.py:85-117, called from fabric/plugins/io/torch_io.py:58). For a local path
sprite has ``torch.save`` write straight into a new temporary name beside the target (never through a symlink; no
copy of the checkpoint in memory), hashes the file's 64 MiB pieces on a pool of threads from the page cache
(``sprite.digest.open_file``) and renames it to the target as Lightning's transaction does. A file that replaces
one of the same name is fsynced first, by one more thread while the others hash; a new name is fsynced in the
background (``sprite.runtime.durable``). Sealing the file later costs no second read. Remote paths keep
Lightning's own write.

Sharded folder: Lightning's ``torch.distributed.checkpoint.save`` (fabric/strategies/fsdp.py:860, imported by
pytorch/strategies/model_parallel.py and fsdp.py) infers a ``FileSystemWriter`` that writes each rank's shards on
one thread and fsyncs every file. sprite's writer leaves the fsync to ``sprite.runtime.ckpt_seal``, which does it
in the background for a new folder.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from sprite import digest
from sprite.runtime import durable
from sprite.writeonce import created

# FileSystemWriter threads per rank, each writing its own __<rank>_<i>.distcp file. 1: with the state on GPUs, 4
# threads saved more slowly on a 2-H200 host (2.28 s vs 1.83 s, docs/runs/h200x2-2026-11-30-d), as torch's own
# filesystem.py warns (more threads give up its overlapping device-to-host copies).
DCP_THREADS = 1

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
    replacing, keep = os.path.lexists(target), None
    try:
        with created(temp, mode=None, readable=True, sync=False) as fd:
            with os.fdopen(os.dup(fd), "wb") as out:  # the same writer torch.save uses for any file object
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


def dcp_save(converted_state: dict, path) -> None:
    """Lightning's ``_distributed_checkpoint_save`` with sprite's writer: no fsync (the seal sees to it). Every rank
    calls it, as Lightning does."""
    from torch.distributed.checkpoint import FileSystemWriter, save

    save(converted_state, storage_writer=FileSystemWriter(path, sync_files=False, thread_count=DCP_THREADS))


def install() -> None:
    """Route TorchCheckpointIO's writes through :func:`atomic_save` and Lightning's sharded saves through
    :func:`dcp_save` (idempotent)."""
    from lightning.fabric.plugins.io import torch_io
    from lightning.pytorch.strategies import fsdp, model_parallel

    torch_io._atomic_save = atomic_save
    model_parallel._distributed_checkpoint_save = dcp_save
    fsdp._distributed_checkpoint_save = dcp_save
