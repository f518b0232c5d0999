"""Run one launch as a child of ``sprite run``: its own process group, signals forwarded, output copied to a log,
and nothing of it left running afterwards (``reaper.sweep``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from sprite.launch.procgroup import pump, signal_group, stop_groups
from sprite.recovery.reaper import become_subreaper, descendants, sweep

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)
STOPPING = (signal.SIGINT, signal.SIGTERM)


@dataclass
class Outcome:
    """How a launch ended: its exit code (128+N for signal N), the signals sprite forwarded to it, and whether
    sprite stopped it itself (``stopped_by`` names why)."""

    code: int
    forwarded: list[int] = field(default_factory=list)
    stopped_by: str = ""


class Child:
    """A running launch. ``stop`` ends it: SIGTERM to its process group, SIGKILL after ``grace`` seconds."""

    def __init__(self, argv: list[str], env: dict, cwd: str | None, log_path: Path) -> None:
        self.spared = set(descendants(os.getpid()))
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        self.log = os.fdopen(fd, "wb", buffering=0)
        self.lock = threading.Lock()
        self.proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     start_new_session=True)
        self.pumps = [threading.Thread(target=pump, args=(s, sink, self.log, self.lock), daemon=True)
                      for s, sink in ((self.proc.stdout, sys.stdout.buffer), (self.proc.stderr, sys.stderr.buffer))]
        for thread in self.pumps:
            thread.start()

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
        signal_group(self.proc.pid, sig)

    def stop(self, grace: float) -> None:
        stop_groups([self.proc], grace=grace)

    def finish(self) -> int:
        """Wait for the launcher, kill whatever of it is left, close the log; returns the exit code (128+N)."""
        code = self.proc.wait()
        self.signal_group(signal.SIGKILL)
        sweep(self.spared)
        for thread in self.pumps:
            thread.join(timeout=5)
        self.log.close()
        return code if code >= 0 else 128 - code


class Forwarding:
    """Catches SIGINT, SIGTERM, SIGUSR1 and SIGUSR2 while a run lasts; ``received`` holds them for ``run``."""

    def __enter__(self) -> "Forwarding":
        self.received: list[int] = []
        self.previous = {sig: signal.signal(sig, lambda signum, frame: self.received.append(signum))
                         for sig in FORWARDED}
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)

    @property
    def stopping(self) -> bool:
        return any(sig in STOPPING for sig in self.received)


def run(argv: list[str], env: dict, cwd: str | None, log_path: Path, tick: Callable[[], str | None],
        signals: Forwarding, grace: tuple[float, float] = (5.0, 30.0), poll: float = 0.5) -> Outcome:
    """Run ``argv`` to its end. ``tick()`` is called every ``poll`` seconds; a non-empty answer is a reason to
    stop the launch: it is written to the log, then the launcher's process group gets SIGTERM and ``grace[0]``
    seconds later SIGKILL. Signals caught by ``signals`` go to the launcher; after SIGINT/SIGTERM it gets
    ``grace[1]`` seconds before SIGKILL.

    Raises OSError when the launcher cannot be started.
    """
    become_subreaper()
    child = Child(argv, env, cwd, log_path)
    outcome, stop_at = Outcome(0), None
    try:
        while child.proc.poll() is None:
            while signals.received:
                sig = signals.received.pop(0)
                outcome.forwarded.append(sig)
                child.note(f"sprite: received {signal.Signals(sig).name}; passing it to the launcher.")
                child.proc.send_signal(sig)
                if sig in STOPPING and stop_at is None:
                    stop_at = time.monotonic() + grace[1]
            if stop_at is not None and time.monotonic() > stop_at:
                child.signal_group(signal.SIGKILL)
            reason = tick() if not outcome.stopped_by else None
            if reason:
                outcome.stopped_by = reason
                child.note(reason)
                child.stop(grace[0])
            time.sleep(poll)
    finally:
        outcome.code = child.finish()
    return outcome
