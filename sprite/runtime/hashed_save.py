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
in the background for a new folder, and hashes each shard file's 64 MiB pieces while the file is still being
written (``sprite.digest.Growing``), so the seal reads none of them again.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path

from sprite import digest
from sprite.runtime import durable
from sprite.runtime.collective import paused_gc
from sprite.writeonce import created

# FileSystemWriter threads per rank, each writing its own __<rank>_<i>.distcp file. 1: with the state on GPUs, 4
# threads saved more slowly on a 2-H200 host (2.28 s vs 1.83 s, docs/runs/h200x2-2026-11-30-d), as torch's own
# filesystem.py warns (more threads give up its overlapping device-to-host copies).
DCP_THREADS = 1

# realpath -> (size, mtime_ns, inode, sprite.digest entry, whether its fsync is seen to) of files this process
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
    """The manifest entry (``sprite.digest``) this process computed while writing ``path``, if the file is still
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


class _HashedStream:
    """A shard file while torch's writer writes it: every write goes to the file, and each time another
    ``digest.CHUNK`` bytes are in, they are flushed and handed to the file's hasher. A seek (torch's writer makes
    none) leaves the file to be hashed whole by the seal."""

    def __init__(self, stream, path):
        self._stream, self.end, self.entry, self.growing = stream, 0, None, None
        try:  # the hasher reads through a read-only descriptor of the same file (torch opens it write-only)
            self._reader = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:  # not readable: the seal hashes the file after it is written (and says why if it cannot)
            self._reader, self.moved = None, True
            return
        mine, written = os.fstat(self._reader), os.fstat(stream.fileno())
        self.growing = digest.Growing(self._reader)
        self.moved = (mine.st_dev, mine.st_ino) != (written.st_dev, written.st_ino)  # not the file written

    def write(self, data) -> int:
        count = self._stream.write(data)
        self.end += count
        if not self.moved and self.end - self.growing.hashed >= digest.CHUNK:
            self._stream.flush()
            self.growing.written(self.end)
        return count

    def seek(self, *args):
        self.moved = True
        return self._stream.seek(*args)

    def close(self) -> None:
        """Finish the hash while the file is still open (torch's writer closes the file itself), then close."""
        try:
            if not self._stream.closed:
                self._stream.flush()
                self.entry = None if self.moved else _entry_or_none(self.growing)
        finally:
            if self.growing is not None:
                self.growing.close()
            if self._reader is not None:
                os.close(self._reader)
                self._reader = None
            self._stream.close()

    def __getattr__(self, name):
        return getattr(self._stream, name)


def _hashing_file_system():
    """torch's local FileSystem, except that the shard files (``*.distcp``) it creates are hashed as they are
    written and remembered for the seal (fsync not seen to: the seal does it)."""
    from torch.distributed.checkpoint.filesystem import FileSystem

    class HashingFileSystem(FileSystem):
        @contextlib.contextmanager
        def create_stream(self, path, mode):
            if mode != "wb" or not os.fspath(path).endswith(".distcp"):
                with super().create_stream(path, mode) as stream:
                    yield stream
                return
            with super().create_stream(path, mode) as stream:
                hashed = _HashedStream(stream, path)
                try:
                    yield hashed
                finally:
                    hashed.close()
            if hashed.entry is not None:
                _remember(path, hashed.entry, fsync_seen_to=False)

    return HashingFileSystem()


def _entry_or_none(growing) -> dict | None:
    try:
        return growing.entry()
    except OSError:  # the seal hashes the file itself and reports what it finds
        return None


def dcp_save(converted_state: dict, path) -> None:
    """Lightning's ``_distributed_checkpoint_save`` with sprite's writer: no fsync (the seal sees to it), shard
    files hashed while they are written. Every rank calls it, as Lightning does."""
    from torch.distributed.checkpoint import FileSystemWriter, save

    writer = FileSystemWriter(path, sync_files=False, thread_count=DCP_THREADS)
    writer.fs = _hashing_file_system()
    with paused_gc():
        save(converted_state, storage_writer=writer)


def install() -> None:
    """Route TorchCheckpointIO's writes through :func:`atomic_save` and Lightning's sharded saves through
    :func:`dcp_save` (idempotent)."""
    from lightning.fabric.plugins.io import torch_io
    from lightning.pytorch.strategies import fsdp, model_parallel

    torch_io._atomic_save = atomic_save
    model_parallel._distributed_checkpoint_save = dcp_save
    fsdp._distributed_checkpoint_save = dcp_save
