"""Make checkpoint files durable off the training loop's path, and remove a superseded checkpoint only after that.

A save to a new name returns once its files are written, hashed and sealed and rank 0 has appended its audit
record; the fsync of its files, of its manifest, of the audit trail and of their folders runs on one background
thread per rank (:func:`saved`). None of it may wait on the training loop's path: on ext4 a small fsync waits for
a large one in progress (one journal), so a manifest fsynced during the save would wait for the checkpoint's own
data. If the node crashes before the data reached the disk, the checkpoint has no manifest or one that no longer
matches its files, so ``--resume auto`` skips it. The checkpoint before it is still on disk, because every removal that
ModelCheckpoint asks for (``save_top_k``) waits on the same thread (:func:`remove_later`) until this rank's fsyncs
are done and every rank has counted the newest save as durable in the process group's store. A save that
replaces a checkpoint of the same name (``last.ckpt``, a folder in use) fsyncs before it replaces, during the
save, so a durable checkpoint is always on disk. The script's end waits for all of it (:func:`drain`).
"""

from __future__ import annotations

import atexit
import os
import queue
import sys
import threading
import time

from sprite.integrity.writeonce import fsync_dir, fsync_file

LOCK = threading.Lock()  # held while a name changes: a save putting a checkpoint in place, a removal
WAIT_ALL_SECONDS = 1800.0  # as long as Lightning's default process-group timeout
AT_EXIT_SECONDS = 120.0

_jobs: queue.Queue = queue.Queue()
_thread: threading.Thread | None = None
_failed: list[str] = []
_saves = 0  # Trainer.save_checkpoint calls so far: the same count on every rank (every rank calls it)
_unsealed: set[int] = set()  # saves of this process that came out without a manifest


def _serve() -> None:
    while True:
        job = _jobs.get()
        try:
            job()
        except Exception as err:  # kept for check(), which the next save calls
            _failed.append(f"{type(err).__name__}: {err}")


def _forget() -> None:
    """In a forked child (a DataLoader worker): the parent's thread and queue are not this process's to serve."""
    global _jobs, _thread
    _jobs, _thread = queue.Queue(), None


os.register_at_fork(after_in_child=_forget)


def later(job) -> None:
    """Run ``job()`` on the background thread, after every job queued before it."""
    global _thread
    if _thread is None:
        _thread = threading.Thread(target=_serve, name="sprite-durable", daemon=True)
        _thread.start()
        atexit.register(drain, AT_EXIT_SECONDS)
    _jobs.put(job)


def drain(seconds: float | None = None) -> bool:
    """Wait until every job queued so far has run (at most ``seconds``); True when they all have."""
    if _thread is None:
        return True
    done = threading.Event()
    _jobs.put(done.set)
    return done.wait(seconds)


def check() -> None:
    """Raises OSError when a background fsync or removal failed (the next save calls it, so the run stops)."""
    if _failed:
        raise OSError(f"a checkpoint could not be made durable in the background: {_failed[0]}")


def fsync_later(fd: int) -> None:
    """fsync the open file ``fd`` (a duplicate this module now owns and closes) in the background."""
    def job():
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    later(job)


def _store():
    """The process group's store and world size, or (None, 1) without a process group of more than one rank."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            return dist.distributed_c10d._get_default_store(), dist.get_world_size()
    except (ImportError, RuntimeError, ValueError):
        pass
    return None, 1


def _key(save: int) -> str:
    return f"sprite/durable/{save}"


def saved(paths: list, dirs: list = (), sealed: bool = True) -> None:
    """After this rank's part of a save: in the background, fsync the files ``paths`` and the folders ``dirs``,
    and count this rank in for the save. ``sealed`` False (rank 0: the save has no manifest) keeps every
    checkpoint that a removal asks for afterwards."""
    global _saves
    _saves += 1
    save, (store, _) = _saves, _store()
    if not sealed:
        _unsealed.add(save)

    def job():
        try:
            for path in paths:
                fsync_file(path)
            for path in dirs:
                fsync_dir(path)
        except Exception:
            if store is not None:
                store.add(_key(save) + "/failed", 1)
            raise
        finally:
            if store is not None:
                store.add(_key(save), 1)
    later(job)


def _identity(path) -> tuple | None:
    try:
        info = os.stat(path, follow_symlinks=False)
    except OSError:
        return None
    return info.st_dev, info.st_ino


def _all_durable(store, world: int, save: int) -> bool:
    """Whether every rank made save number ``save`` durable (waits up to WAIT_ALL_SECONDS for them to say)."""
    deadline = time.monotonic() + WAIT_ALL_SECONDS
    while store.add(_key(save), 0) < world:
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return store.add(_key(save) + "/failed", 0) == 0


def remove_later(path, remove) -> None:
    """Call ``remove()`` (which removes ``path``) in the background once the newest save is durable on every rank.

    Nothing is removed when a fsync failed, when the newest save was not sealed, when a rank never confirmed, or
    when ``path`` is no longer the file or folder it was when the removal was asked for (saved again under the
    same name since): the older checkpoint stays, and sprite says so (but not for a name saved again)."""
    save, (store, world), identity = _saves, _store(), _identity(path)

    def job():
        reason = ""
        if _failed:
            reason = "a newer checkpoint could not be made durable"
        elif save in _unsealed:
            reason = "the newer checkpoint was not sealed"
        elif store is not None and save and not _all_durable(store, world, save):
            reason = "not every rank confirmed that the newer checkpoint is on disk"
        if reason:
            print(f"sprite: kept {path}: {reason}", file=sys.stderr, flush=True)
            return
        with LOCK:
            if identity is not None and _identity(path) == identity:
                remove()
    later(job)
