"""Checkpoints written once and sealed: a Lightning save into a new name, then a manifest written last.

A file checkpoint (1 device, DDP, FSDP2 full state) is written by rank 0 straight into a new file, hashed on the
way, so no existing file is ever replaced and the seal needs no second read. A sharded FSDP2 checkpoint (a
torch.distributed.checkpoint folder) goes into a folder rank 0 creates fresh; every rank then fsyncs and
describes the files it wrote, rank 0 gathers the descriptions and seals the folder once all ranks confirmed.
Only rank workers import this module.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import re
import threading

import torch
import torch.distributed as dist
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO

from sprite import integrity

_SHARD = re.compile(r"__(\d+)_\d+\.distcp$")  # torch.distributed.checkpoint's FileSystemWriter names


class _HashingFile:
    """What torch.save writes into: every chunk is hashed, then written to ``fd``."""

    def __init__(self, fd: int):
        self.fd, self.sha, self.size = fd, hashlib.sha256(), 0

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        self.sha.update(view)
        self.size += view.nbytes
        while view:
            view = view[os.write(self.fd, view):]
        return self.size

    def flush(self) -> None:
        pass


def save_hashed(obj, path: pathlib.Path) -> dict:
    """torch.save of ``obj`` straight into the new file ``path`` (created as integrity.write_new creates files:
    never over an existing name or through a symlink, mode 0600, fsynced), hashing the bytes on the way, so
    there is neither an in-memory copy nor a second read; returns the file's manifest entry.

    Raises IntegrityError if ``path`` exists (or is a symlink); a failed save removes the partial file.
    """
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except FileExistsError:
        raise integrity.IntegrityError(f"{path} exists already; refusing to write a checkpoint over it.",
                                       "An earlier run wrote there.", "Save into a fresh directory.") from None
    try:
        os.fchmod(fd, 0o600)
        sink = _HashingFile(fd)
        torch.save(obj, sink)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(path)
        raise
    os.close(fd)
    return {path.name: {"size": sink.size, "sha256": sink.sha.hexdigest()}}


def load_verified(path: pathlib.Path):
    """torch.load of a sealed file while another thread verifies it; the state is returned only if it verifies.

    Raises IntegrityError naming what differs (also when the damage made torch.load fail).
    """
    verdict: dict = {}
    checker = threading.Thread(target=lambda: verdict.update(v=integrity.verify(path)))
    checker.start()
    state, failure = None, None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # a damaged file may not even unpickle: the verdict says why first
        failure = err
    finally:
        checker.join()
    if not verdict["v"].valid:
        raise integrity.IntegrityError(f"{path} does not match its manifest: {verdict['v'].reason}.",
                                       "It was changed after the save.", "Use another checkpoint.")
    if failure is not None:
        raise failure
    return state


class WriteOnceCheckpointIO(TorchCheckpointIO):
    """Lightning's torch.save checkpoint IO, but the file must be new (never written over), is fsynced, and is
    hashed while written (``files``, for the seal that follows in ``save_sealed``)."""

    files: dict | None = None

    def save_checkpoint(self, checkpoint: dict, path, storage_options=None) -> None:
        """Raises IntegrityError if ``path`` exists (or is a symlink)."""
        self.files = save_hashed(checkpoint, pathlib.Path(path))


def _gather(value) -> list:
    if not dist.is_available() or not dist.is_initialized():
        return [value]
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, value)
    return gathered


def _own_files(folder: pathlib.Path, rank: int) -> list[str]:
    """The files of a DCP folder this rank wrote: its shards; rank 0 also owns the metadata files."""
    owned = []
    for name in sorted(os.listdir(folder)):
        match = _SHARD.match(name)
        if (int(match.group(1)) == rank) if match else rank == 0:
            owned.append(name)
    return owned


def save_sealed(trainer, path: pathlib.Path, meta: dict) -> None:
    """Saves the trainer's checkpoint at ``path`` (a new folder for a sharded FSDP2 save, else a new file) and
    seals it. Every rank must call it.

    Raises IntegrityError on every rank if ``path`` exists, or on rank 0 if the shard files the ranks describe
    differ from what the folder holds.
    """
    strategy, rank = trainer.strategy, trainer.global_rank
    sharded = bool(getattr(strategy, "_save_distributed_checkpoint", False))
    if os.path.lexists(path):
        raise integrity.IntegrityError(f"{path} exists already; refusing to save a checkpoint over it.",
                                       "An earlier run wrote there.", "Save into a fresh directory.")
    strategy.barrier("sprite.save_sealed.checked")  # every rank looked before rank 0 creates the folder
    if rank == 0:
        path.parent.mkdir(parents=True, exist_ok=True)
        if sharded:
            integrity.make_dir_new(path)
    strategy.barrier("sprite.save_sealed.start")
    trainer.save_checkpoint(path)
    if not sharded:
        if rank == 0:
            files = getattr(strategy.checkpoint_io, "files", None)
            integrity.seal(path, {**meta, "format": "file"}, files if files and path.name in files else None)
        strategy.barrier("sprite.save_sealed.end")
        return
    names = _own_files(path, rank)
    for name in names:  # Lightning's meta.pt is written by a plain torch.save, without fsync
        integrity.fsync_file(path / name)
    described = _gather(integrity.describe(path, names))
    if rank == 0:
        files = {rel: entry for part in described for rel, entry in part.items()}
        missing = sorted(set(os.listdir(path)) - set(files))
        if missing:
            raise integrity.IntegrityError(f"{path}: no rank described {', '.join(missing)}.",
                                           "A rank wrote a file sprite does not know the owner of.",
                                           "Report this with the folder listing.")
        integrity.seal(path, {**meta, "format": "dcp", "world": len(described)}, files)
    strategy.barrier("sprite.save_sealed.end")
