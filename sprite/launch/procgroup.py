"""A launched process group from the outside: copy its output, signal it, and stop it (TERM, a grace period,
then KILL of the whole group). The local supervisor does this for its ranks, ``sprite run`` for the launcher it
starts (``sprite.recovery.child``), and ``run_plan`` for a harness arm; each process was started in a session of
its own, so its pid is its group's id.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import threading
import time

GRACE_SECONDS = 5.0
_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    # Linux only: the kernel sends SIGKILL to the rank if the supervisor itself is killed, so a `kill -9`
    # of sprite leaves no orphan rank holding the rendezvous port.
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass


def pump(stream, sink, log, lock: threading.Lock, prefix: bytes = b"") -> None:
    """Copy ``stream`` line by line to ``sink`` (with ``prefix``; None: nowhere) and to ``log`` (None: no log)
    until it ends. A sink that is gone (a closed terminal, a broken pipe) is skipped, so the stream keeps
    draining and the process never blocks on a full pipe."""
    for line in iter(stream.readline, b""):
        with lock:
            if log is not None:
                log.write(line)
                log.flush()
            if sink is not None:
                try:
                    sink.write(prefix + line)
                    sink.flush()
                except (OSError, ValueError):
                    pass
    stream.close()


def signal_group(pid: int, sig: int) -> None:
    """Send ``sig`` to the process group ``pid`` leads; a group that is gone already is no error."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop_groups(procs: list[subprocess.Popen], sig: int = signal.SIGTERM, grace: float = GRACE_SECONDS) -> None:
    """Send ``sig`` to every live process's group, wait up to ``grace`` seconds for them all, then SIGKILL each
    group (a rank's own children, such as data loader workers, must not outlive it) and reap the processes."""
    for proc in procs:
        if proc.poll() is None:
            signal_group(proc.pid, sig)
    deadline = time.monotonic() + grace
    for proc in procs:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for proc in procs:
        signal_group(proc.pid, signal.SIGKILL)
        proc.wait()
