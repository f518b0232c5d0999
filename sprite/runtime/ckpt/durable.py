"""The background side of checkpointing: one thread per rank finishes each save off the training loop's path.

A save returns to training once its state is copied off the device (``sprite.runtime.ckpt.seal``); the write, the
hashing, the fsyncs, the manifest and then the removal of the checkpoint it supersedes are jobs run in order on
this rank's one thread (:func:`later`). At most one save is in flight: the next save first waits for every job
queued before it (:func:`wait`), and that wait is part of its stall. The end of a fit, a preemption and an
exception wait too (:func:`drain`, called by the runtime), so a rank leaves only once its save is sealed or has
failed. A save that failed on any rank is not sealed, keeps every older checkpoint, and fails the run: the next
save, or the end of the fit, raises :class:`SaveFailed` with one line. A rank killed mid-save leaves a checkpoint
without a manifest, which ``--resume auto`` skips.
"""

from __future__ import annotations

import atexit
import os
import queue
import sys
import threading

from sprite.errors import SpriteError, one_line
from sprite.integrity.writeonce import fsync_file

LOCK = threading.Lock()  # held while a name changes: a save putting a checkpoint in place, a removal
AT_EXIT_SECONDS = 1800.0  # as long as Lightning's default process-group timeout
THREAD_NAME = "sprite-durable"

_jobs: queue.Queue = queue.Queue()
_thread: threading.Thread | None = None
_failed: list[str] = []
_unsealed = [False]  # whether the newest save came out without a manifest (then nothing it supersedes goes)


class SaveFailed(SpriteError):
    """A checkpoint saved in the background could not be written, made durable or sealed."""


def _serve() -> None:
    while True:
        job = _jobs.get()
        try:
            job()
        except SaveFailed as err:  # its cause and fix are check()'s to give, not repeated inside its message
            fail(err.what.rstrip("."))
        except BaseException as err:  # noqa: BLE001 - kept for check(), which the next save and the end of the
            # fit call; this thread must outlive any job, or drain() would wait for it for ever
            fail(f"{type(err).__name__}: {err}")


def fail(reason: str) -> None:
    """Record that background checkpoint work failed; says so on stderr at once (the run stops at the next save)."""
    _failed.append(reason)
    print(f"sprite: error: {one_line(reason, 400)}", file=sys.stderr, flush=True)


def _forget() -> None:
    """In a forked child (a DataLoader worker): the parent's thread and queue are not this process's to serve."""
    global _jobs, _thread
    _jobs, _thread = queue.Queue(), None


os.register_at_fork(after_in_child=_forget)


def later(job) -> None:
    """Run ``job()`` on the background thread, after every job queued before it."""
    global _thread
    if _thread is None:
        _thread = threading.Thread(target=_serve, name=THREAD_NAME, daemon=True)
        _thread.start()
        atexit.register(drain, AT_EXIT_SECONDS)
    _jobs.put(job)


def drain(seconds: float | None = None) -> bool:
    """Wait until every job queued so far has run (at most ``seconds``); True when they all have."""
    if _thread is None or threading.current_thread() is _thread:
        return True
    done = threading.Event()
    _jobs.put(done.set)
    return done.wait(seconds)


def settle() -> None:
    """At the end of a fit that returned: wait for the save in flight (at most ``AT_EXIT_SECONDS``) and record a
    wait that ran out as a failure, so :func:`check` fails the rank instead of letting it exit 0 unsealed."""
    if not drain(AT_EXIT_SECONDS):
        fail(f"the save in flight was still running after {AT_EXIT_SECONDS:.0f} s")


# How torch's process executor says its checkpoint process has gone (torch 2.11-2.13,
# distributed/checkpoint/_async_process_executor.py); another wording gets the disk's advice below.
PROCESS_GONE = "checkpoint background process is dead"


def advice(reason: str) -> tuple[str, str]:
    """``(cause, fix)`` for a background save that failed for ``reason``: torch's checkpoint process gone (it logs
    why in the rank's output: a port taken, its shared memory full), else the disk (full, read-only)."""
    if PROCESS_GONE in reason.lower():
        return ("torch's checkpoint process exited (its own lines above in this rank's log say why, e.g. a port "
                "taken or /dev/shm full); the previous checkpoint is kept.",
                "Pass --checkpoint-writer thread to write in a thread of each rank, then resume with --resume auto.")
    return ("The disk may be full or the file system read-only; the previous checkpoint is kept.",
            "Free space or fix the file system, then resume with --resume auto.")


def check() -> None:
    """Raises SaveFailed when background checkpoint work failed (the next save and the end of the fit call it)."""
    if _failed:
        raise SaveFailed(f"A checkpoint saved in the background failed: {one_line(_failed[0], 300)}.",
                         *advice(_failed[0]))


def wait() -> None:
    """Before a save: wait for the one in flight (at most one a rank), then raise if background work failed."""
    drain()
    check()


def fsync_later(fd: int) -> None:
    """fsync the open file ``fd`` (a duplicate this module now owns and closes) in the background."""
    def job():
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    later(job)


def outcome(sealed: bool) -> None:
    """Record on this rank (every rank learns it) whether the newest save was sealed."""
    _unsealed[0] = not sealed


def _identity(path) -> tuple | None:
    try:
        info = os.stat(path, follow_symlinks=False)
    except OSError:
        return None
    return info.st_dev, info.st_ino


def remove_later(path, remove) -> None:
    """Call ``remove()`` (which removes ``path``) on the background thread, after the save in flight is sealed.

    Nothing is removed when background work failed, when the newest save was not sealed, or when ``path`` is no
    longer the file or folder it was when the removal was asked for (saved again under the same name since): the
    older checkpoint stays, and sprite says so (but not for a name saved again)."""
    identity = _identity(path)

    def job():
        reason = ""
        if _failed:
            reason = "a newer checkpoint could not be saved"
        elif _unsealed[0]:
            reason = "the newer checkpoint was not sealed"
        if reason:
            print(f"sprite: kept {path}: {reason}", file=sys.stderr, flush=True)
            return
        with LOCK:
            if identity is not None and _identity(path) == identity:
                remove()
    later(job)


def fsync_all(paths: list) -> None:
    """fsync each file of ``paths`` (raises OSError)."""
    for path in paths:
        fsync_file(path)
