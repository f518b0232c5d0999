"""Lightning's checkpoint writes: hashed, made durable, and (inside a sealed save) run in the background.

Single file: Lightning 2.6.6 serializes a checkpoint into memory and writes the bytes through an fsspec
transaction (fabric/utilities/cloud_io.py:85-117, called from fabric/plugins/io/torch_io.py:58). sprite replaces
that write. Inside a save that ``sprite.runtime.ckpt.seal`` runs (:func:`collecting`), the checkpoint's copy
off the device is queued (``sprite.runtime.ckpt.stage``) and the write runs later on the background thread, once
the copy is done:
``torch.save`` into a new temporary name beside the target (never through a symlink), fsync, a pool of threads
hashes its 64 MiB pieces from the page cache; the seal renames it to the target once every rank's files are
durable. Called outside such a save, :func:`atomic_save` does the same at once and renames at the end. Remote
paths keep Lightning's own write.

Sharded folder: Lightning's ``torch.distributed.checkpoint.save`` (fabric/strategies/fsdp.py:860, imported by
pytorch/strategies/model_parallel.py and fsdp.py) is replaced by :func:`dcp_save`: torch's ``dcp.async_save``
with torch's ``FileSystemWriter`` (``sprite.runtime.ckpt.dcp_write``) and sprite's stager inside a sealed save,
which returns once the state's copy into host memory is queued (``sprite.runtime.ckpt.stage``); ``dcp.save`` with
the same writer outside one. The seal hashes the files after.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import sys
from pathlib import Path

from sprite import integrity
from sprite.integrity import digest
from sprite.integrity.writeonce import created
from sprite.runtime.ckpt import durable
from sprite.runtime.ckpt.gcpause import paused_gc

# realpath -> (size, mtime_ns, inode, sprite.integrity.digest entry, whether its fsync is seen to) of files this process
# wrote and hashed in one pass
_WRITTEN: dict[str, tuple[int, int, int, dict, bool]] = {}
_collect: list | None = None  # the background writes of the save seal.py is running, while it runs
_host = None  # this rank's reusable host buffers (stage.HostCopy)
_stagers: dict = {}  # this rank's stager per async mode (stage.stager: host buffers kept from save to save)


class Pending:
    """One background write of a save: ``run()`` waits for or does the write and returns ``{name: entry}`` of
    the files it hashed (names relative to the checkpoint's folder, or the file's own name); ``publish()``, on
    rank 0 once every rank's files are durable, puts a file in place; ``discard()`` removes what a failed save
    left under a temporary name; ``temp``: that name (a file written aside), else None."""

    def __init__(self, run, publish=lambda: None, discard=lambda: None, temp: Path | None = None):
        self.run, self.publish, self.discard, self.temp = run, publish, discard, temp


@contextlib.contextmanager
def collecting():
    """Inside the block, Lightning's writes are staged and returned as :class:`Pending` writes in the list yielded,
    to be run in the background."""
    global _collect
    _collect = []
    try:
        yield _collect
    finally:
        _collect = None
        stage = sys.modules.get("sprite.runtime.ckpt.stage")
        if stage is not None:  # the save's device copies were queued: later kernels wait for them (stage.fence)
            stage.fence()


def _temp(target: Path) -> Path:
    return target.with_name(f".{target.name}.sprite-tmp-{secrets.token_hex(4)}")


def _write_temp(checkpoint, temp: Path, fsync: bool) -> tuple[dict, int | None]:
    """``torch.save`` into the new file ``temp``, hashed from the page cache (and fsynced by one more thread while
    the others hash, when ``fsync``). Returns the entry and, when not ``fsync``, a duplicate descriptor to fsync
    later."""
    import torch

    from sprite.runtime.ckpt.dcp_write import no_crc32

    with created(temp, mode=None, readable=True, sync=False) as fd:
        with os.fdopen(os.dup(fd), "wb") as out, no_crc32():  # torch.save's writer for any file object
            torch.save(checkpoint, out)
        entry = digest.open_file(fd, beside=(lambda: os.fsync(fd)) if fsync else None)
        return entry, None if fsync else os.dup(fd)


def atomic_save(checkpoint: dict, filepath) -> None:
    """Serialize ``checkpoint`` with ``torch.save`` and put it at ``filepath`` whole or not at all, now; or, inside
    :func:`collecting` for a local path, copy it to host memory and leave the write to the background.

    Raises:
        OSError: the write, fsync or rename failed (the temporary file is removed).
    """
    text = os.fspath(filepath)
    if "://" in text:
        return _lightning_atomic_save(checkpoint, filepath)
    target = Path(text)
    if _collect is not None:
        return _collect.append(_staged_file(checkpoint, target))
    temp = _temp(target)
    replacing, keep = os.path.lexists(target), None
    try:
        with paused_gc():
            entry, keep = _write_temp(checkpoint, temp, fsync=replacing)
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


def _staged_file(checkpoint: dict, target: Path) -> Pending:
    """The checkpoint copied off the device now; its write, fsync and hash later (module docstring)."""
    global _host
    from sprite.runtime.ckpt.stage import HostCopy

    _host = _host or HostCopy()
    with paused_gc():
        host, ticket = _host.queue(checkpoint)
    temp = _temp(target)

    def run() -> dict:
        ticket.wait()
        entry, _ = _write_temp(host, temp, fsync=True)
        return {target.name: entry}

    def publish() -> None:
        os.replace(temp, target)  # the caller holds durable.LOCK

    def discard() -> None:  # the file and a manifest sealed beside it (seal._finish), both made by this save
        for path in (temp, integrity.manifest_path(temp)):
            if os.path.lexists(path):
                os.unlink(path)

    return Pending(run, publish, discard, temp)


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


def dcp_save(converted_state: dict, path, process_group=None) -> None:
    """Lightning's ``_distributed_checkpoint_save`` with torch's ``FileSystemWriter`` as sprite sets it up
    (``sprite.runtime.ckpt.dcp_write``). Every rank calls it, as Lightning does. Inside :func:`collecting`: torch's
    ``dcp.async_save``, which returns once the state's copy into host memory is queued; the write goes on in the
    background and the :class:`Pending` added waits for it. Otherwise ``dcp.save`` now. No fsync (the seal sees
    to it); the files are hashed when the save is sealed."""
    from sprite.runtime.ckpt import dcp_write

    import torch.distributed as dist

    # Only the first rank looks inside: it looks before it joins the save's planning collective, so no rank has
    # written yet; a later rank could already see the first rank's files (seen: a 2-rank FSDP fit under load).
    first = not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0
    if os.path.islink(path) or (first and os.path.isdir(path) and os.listdir(path)):
        raise FileExistsError(f"{path} is a symlink or a folder that is not empty: a sharded checkpoint is written "
                              "only into a new folder (nothing in it is written over).")
    if _collect is None:
        from torch.distributed.checkpoint import save

        with torch_errors(), paused_gc():
            save(converted_state, storage_writer=dcp_write.writer(path), planner=dcp_write.planner(converted_state))
        return
    from sprite.runtime.ckpt import background

    _collect.append(_async_dcp(converted_state, path, process_group or background.group()))


def stager_of(mode: str):
    """This rank's stager (``stage.stager``) for the writer ``mode``, or None before its first save in it."""
    return _stagers.get(mode)


def forget() -> None:
    """After this process's process group ended and before another starts (a warm pool's next role): the next
    save makes its own writer and gloo group instead of using ones tied to the group that ended."""
    from sprite.runtime.ckpt import background, dcp_write

    background.forget()
    dcp_write.new_group()


def _async_dcp(state: dict, path, group) -> Pending:
    from torch.distributed.checkpoint import async_save
    from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

    from sprite.runtime.ckpt import dcp_write
    from sprite.runtime.ckpt.stage import stager

    mode = dcp_write.mode(state=state, group=group)  # picked at the group's first save, the same on every rank
    # sprite's stager in both modes (dcp_write's docstring: torch 2.11 cannot reuse its own in process mode; the
    # queued copies, sprite.runtime.ckpt.stage); process mode takes torch's default planner
    staging = _stagers.get(mode) or _stagers.setdefault(mode, stager(shared=mode == "process"))
    if mode == "process":
        dcp_write.prefix_store()  # read by torch as it starts its checkpoint process, at the first save
    planner = None if mode == "process" else dcp_write.planner(state)
    with paused_gc():
        started = async_save(state, checkpoint_id=path, storage_writer=dcp_write.writer(path), process_group=group,
                             planner=planner, async_checkpointer_type=AsyncCheckpointerType(mode),
                             async_stager=staging)
    # a stager whose stage() returns a Future gets torch's AsyncSaveResponse (staging and upload futures)
    upload = getattr(started, "upload_completion", started)

    def run() -> dict:
        with torch_errors():
            upload.result()
        return {}

    return Pending(run)


@contextlib.contextmanager
def torch_errors():
    """Inside the block, torch's ``CheckpointException`` (a BaseException, whose text is every rank's traceback)
    becomes an OSError of one line naming each failed rank's own error (:func:`torch_failures`)."""
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        yield
    except CheckpointException as err:
        raise OSError(f"torch's writer failed on {torch_failures(err)}") from None


def torch_failures(err) -> str:
    """Each failed rank's exception in torch's ``CheckpointException`` (its public ``failures``: rank -> the
    exception and its traceback), in one line: "rank 1: OSError: [Errno 28] No space left on device: ..."."""
    from sprite.errors import one_line

    named = []
    for rank, wrapped in sorted((getattr(err, "failures", None) or {}).items()):
        error = wrapped[0] if isinstance(wrapped, tuple) and wrapped else wrapped
        named.append(f"rank {rank}: {type(error).__name__}: {one_line(str(error), 300)}")
    return "; ".join(named) or one_line(str(err), 300)


def install() -> None:
    """Route TorchCheckpointIO's writes through :func:`atomic_save` and Lightning's sharded saves through
    :func:`dcp_save` (idempotent)."""
    from lightning.fabric.plugins.io import torch_io
    from lightning.pytorch.strategies import fsdp, model_parallel

    torch_io._atomic_save = atomic_save
    model_parallel._distributed_checkpoint_save = dcp_save
    fsdp._distributed_checkpoint_save = dcp_save
