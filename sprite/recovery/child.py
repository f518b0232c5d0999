"""Run one launch as a child of ``sprite run``: its own process group, signals forwarded, output copied to a log,
and nothing of it left running afterwards.

sprite becomes a child subreaper (Linux ``PR_SET_CHILD_SUBREAPER``), so a rank or launcher helper that outlives
its parent is re-parented to sprite instead of init, where the final sweep finds it, kills it and reaps it.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)
STOPPING = (signal.SIGINT, signal.SIGTERM)
_PR_SET_CHILD_SUBREAPER = 36


@dataclass
class Outcome:
    """How a launch ended: its exit code (128+N for signal N), the signals sprite forwarded to it, and whether
    sprite stopped it itself (``stopped_by`` names why)."""

    code: int
    forwarded: list[int] = field(default_factory=list)
    stopped_by: str = ""


def become_subreaper() -> None:
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1)
    except OSError:  # not Linux: the launcher's own process group is what gets cleaned up
        pass


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (Linux /proc), children before grandchildren."""
    found, queue = [], [pid]
    while queue:
        parent = queue.pop(0)
        for task in Path(f"/proc/{parent}/task").glob("*"):
            try:
                kids = [int(k) for k in (task / "children").read_text().split()]
            except OSError:
                continue
            found += kids
            queue += kids
    return found


def sweep(spared: set[int]) -> list[int]:
    """SIGKILL and reap every process below this one that is not below one of ``spared`` (this process's
    children from before the launch); returns their pids."""
    keep = set(spared) | {pid for child in spared for pid in descendants(child)}
    left = [pid for pid in descendants(os.getpid()) if pid not in keep]
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for pid in left:
        try:
            os.waitpid(pid, 0)  # only our own children (re-parented orphans) can be reaped; others are the kernel's
        except ChildProcessError:
            pass
    return left


def _pump(stream, sink, log, lock: threading.Lock) -> None:
    for line in iter(stream.readline, b""):
        with lock:
            log.write(line)
            log.flush()
            try:
                sink.write(line)
                sink.flush()
            except (OSError, ValueError):
                pass  # our own output is gone (closed terminal, broken pipe); keep draining the launcher's
    stream.close()


class Child:
    """A running launch. ``stop`` ends it: SIGTERM to its process group, SIGKILL after ``grace`` seconds."""

    def __init__(self, argv: list[str], env: dict, cwd: str | None, log_path: Path) -> None:
        self.spared = set(descendants(os.getpid()))
        self.log = open(log_path, "ab", buffering=0)
        self.lock = threading.Lock()
        self.proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     start_new_session=True)
        self.pumps = [threading.Thread(target=_pump, args=(s, sink, self.log, self.lock), daemon=True)
                      for s, sink in ((self.proc.stdout, sys.stdout.buffer), (self.proc.stderr, sys.stderr.buffer))]
        for pump in self.pumps:
            pump.start()

    def note(self, text: str) -> None:
        """Write one line of sprite's own to stderr and to the attempt's log (the classifier reads it)."""
        line = (text.rstrip("\n") + "\n").encode(errors="replace")
        with self.lock:
            self.log.write(line)
            try:
                sys.stderr.buffer.write(line)
                sys.stderr.flush()
            except (OSError, ValueError):
                pass

    def signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def stop(self, grace: float) -> None:
        self.signal_group(signal.SIGTERM)
        try:
            self.proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
        self.signal_group(signal.SIGKILL)

    def finish(self) -> int:
        """Wait for the launcher, kill whatever of it is left, close the log; returns the exit code (128+N)."""
        code = self.proc.wait()
        self.signal_group(signal.SIGKILL)
        sweep(self.spared)
        for pump in self.pumps:
            pump.join(timeout=5)
        self.log.close()
        return code if code >= 0 else 128 - code


def run(argv: list[str], env: dict, cwd: str | None, log_path: Path, tick: Callable[[], str | None],
        grace: float = 10.0, poll: float = 0.5) -> Outcome:
    """Run ``argv`` to its end. ``tick()`` is called every ``poll`` seconds; a non-empty answer is a reason to
    stop the launch (it is written to the log, then the launch is stopped). SIGINT, SIGTERM, SIGUSR1 and SIGUSR2
    sent to sprite go to the launcher; after SIGINT/SIGTERM it gets ``grace`` seconds before SIGKILL.

    Raises OSError when the launcher cannot be started.
    """
    become_subreaper()
    received: list[int] = []
    previous = {sig: signal.signal(sig, lambda signum, frame: received.append(signum)) for sig in FORWARDED}
    child = Child(argv, env, cwd, log_path)
    outcome, stop_at = Outcome(0), None
    try:
        while child.proc.poll() is None:
            while received:
                sig = received.pop(0)
                outcome.forwarded.append(sig)
                child.note(f"sprite: received {signal.Signals(sig).name}; passing it to the launcher.")
                child.proc.send_signal(sig)
                if sig in STOPPING and stop_at is None:
                    stop_at = time.monotonic() + grace
            if stop_at is not None and time.monotonic() > stop_at:
                child.signal_group(signal.SIGKILL)
            reason = tick() if not outcome.stopped_by else None
            if reason:
                outcome.stopped_by = reason
                child.note(reason)
                child.stop(grace)
            time.sleep(poll)
    finally:
        outcome.code = child.finish()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return outcome
