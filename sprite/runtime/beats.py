"""This rank's progress for sprite's stall watchdog: a heartbeat file kept current by a Lightning callback
(trainer_wrap.py, loaded once the script imports Lightning) or by ``sprite.beat()``. This module imports neither torch
nor Lightning.

A phase change (start, training step, validation, checkpoint save, done) is written at once; step and batch
progress within a phase is written by a daemon thread at most every ``SPRITE_HEARTBEAT_SECONDS``, so a step costs
an integer increment and no file system call, and a rank blocked in a collective still has its last state on
disk. Nothing here talks to another rank. A heartbeat that cannot be written never stops training.
"""

from __future__ import annotations

import atexit
import os
import socket
import sys
import threading
import time
from dataclasses import replace
from typing import Optional

from sprite import contract
from sprite.contract import heartbeat
from sprite.contract.heartbeat import Beat
from sprite.errors import UsageError, show
from sprite.runtime.hang import dump as hang_dump

_current: Optional["Heart"] = None
MAX_INTERVAL = 3600.0  # seconds between heartbeat writes at most; sprite run sets 0.5 to 30 (heartbeat_seconds)


class Heart:
    """Holds this rank's Beat and writes it: phase changes at once, other changes from a background thread."""

    def __init__(self, where, rank: int, interval: float) -> None:
        self.where, self.interval = where, interval
        self.beat = Beat(rank, socket.gethostname(), os.getpid(), 0, heartbeat.START, 0, time.time())
        self._lock, self._dirty, self._warned = threading.Lock(), False, False
        # Writes go out one at a time, in the order their beats were taken: a step the background thread took
        # before a phase change must not land after it (a "done" or "failed" overwritten by "training step").
        self._writing = threading.Lock()
        self._flush()
        threading.Thread(target=self._loop, name="sprite-heartbeat", daemon=True).start()
        atexit.register(self._last)

    def _last(self) -> None:
        """At exit (a failing rank too): write the step the background thread had not written yet, so the
        heartbeat holds the rank's last progress (goodput's lost work after a crash)."""
        if self._dirty:
            self._flush()

    def update(self, phase: Optional[str] = None, step: Optional[int] = None) -> None:
        with self._lock:
            old = self.beat
            now_step = old.step if step is None else step
            first = now_step if old.first_step < 0 and (phase or old.phase) == heartbeat.TRAINING else old.first_step
            # Leaving (done, preempted) is not progress: the beat keeps the time of the last step, so goodput's
            # productive time ends there and a fit's teardown counts as other.
            ended = phase in heartbeat.ENDED
            self.beat = replace(old, phase=phase or old.phase, step=now_step, count=old.count + 1,
                                time=old.time if ended else time.time(), first_step=first)
            self._dirty = True
        if phase is not None and phase != old.phase:
            self._flush()

    def _flush(self) -> None:
        with self._writing:
            with self._lock:
                beat, self._dirty = self.beat, False
            self._write(beat)

    def _write(self, beat: Beat) -> None:
        try:
            heartbeat.write(self.where, beat)
        except OSError as err:
            if not self._warned:
                self._warned = True
                print(f"sprite: warning: cannot write the heartbeat in {self.where} ({err.strerror}); the stall "
                      "watchdog sees no progress from this rank. Put the run folder (--run-dir) on a file system "
                      "every node sees.", file=sys.stderr, flush=True)

    def _loop(self) -> None:
        while True:
            time.sleep(self.interval)
            if self._dirty:
                self._flush()


def heartbeat_interval(env) -> float:
    """Seconds between heartbeat writes within a phase from ``SPRITE_HEARTBEAT_SECONDS`` (5 when unset, at least
    0.05). Raises UsageError for anything but a number above 0 and at most MAX_INTERVAL: inf or a huge number
    overflowed time.sleep in the rank's threads, nan and 0 became 0.05 s and a word 5 s, without a word."""
    raw = env.get(contract.HEARTBEAT_SECONDS, "").strip()
    if not raw:
        return 5.0
    try:
        seconds = float(raw)
    except ValueError:
        seconds = float("nan")
    if not 0 < seconds <= MAX_INTERVAL:  # NaN fails both comparisons
        raise UsageError(f"{contract.HEARTBEAT_SECONDS}={show(raw)} is not a number of seconds above 0 and at most "
                         f"{MAX_INTERVAL:g}.", "sprite run never exports it so (it sets 0.5 to 30): it was set by "
                         "hand or changed after the launch.", f"Unset {contract.HEARTBEAT_SECONDS} or relaunch "
                         "with sprite run.")
    return max(0.05, seconds)


def start(env, rank: int) -> Optional[Heart]:
    """Start this rank's heartbeat when the launch asked for one (``SPRITE_RUN_DIR`` set); else None. Raises
    UsageError for a malformed ``SPRITE_HEARTBEAT_SECONDS``."""
    global _current
    where = heartbeat.folder_from_env(env)
    if where is None:
        return None
    interval = heartbeat_interval(env)
    _current = Heart(where, rank, interval)
    hang_dump.start(_current, env, rank, interval)  # this rank's stacks when it stops advancing (issue 27)
    return _current


def current() -> Optional[Heart]:
    """This rank's Heart, or None when the launch asked for no heartbeat."""
    return _current


def beat(step: Optional[int] = None) -> None:
    """Report one training step of a script without a Lightning Trainer (``sprite.beat(step)``): the stall
    watchdog then holds it to the stall timeout, as a Trainer's steps are. ``step`` None: the last step + 1."""
    if _current is not None:
        _current.update(heartbeat.TRAINING, _current.beat.step + 1 if step is None else int(step))


def finish(step: Optional[int] = None, phase: str = heartbeat.DONE) -> None:
    """Say this rank's script has returned (``phase`` PREEMPTED: it stopped for preemption)."""
    if _current is not None:
        _current.update(phase, step)


def fail() -> None:
    """Say this rank's script failed (an exception, or a non-zero exit): ``sprite run`` stops a launch whose other
    ranks do not end by themselves soon after (recovery/watchdog.py). Never raises."""
    try:
        finish(phase=heartbeat.FAILED)
    except Exception:  # a failing rank must still exit with its own code
        pass
