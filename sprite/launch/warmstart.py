"""Ranks forked from one warm process: on CPU, the local supervisor imports torch and Lightning once and forks
every rank from itself, instead of starting N interpreters that each import them.

``import lightning.pytorch`` costs about 6-7 s of CPU a process on the 2-core CI machine, and a 2-rank launch
paid it twice, in parallel on the same cores (docs/tested.md measured rank start-up as most of the test suite's
CPU time). Forking after the import pays it once; the ranks share the imported pages copy-on-write.

Only where forking after ``import torch`` is safe: the ranks run on CPU (``SPRITE_ACCELERATOR`` is ``cpu``, or
``auto`` on a machine without an NVIDIA or Intel GPU, counted without torch), the rank command is this
interpreter's ``-m sprite.runtime`` (not a staged copy of Python), and nothing has started a thread yet. CUDA
and Level Zero must not be initialised before a fork, so GPU ranks are always started as fresh interpreters.
``SPRITE_FORK_RANKS=0`` turns it off. When the warm imports fail, the ranks start as fresh interpreters, which
then report the error themselves.

A forked rank is set up as a fresh ``python -m sprite.runtime`` would be: its own session, SIGKILL when the
supervisor dies, stdout and stderr on its own pipes, the rank's environment (``os.environ`` replaced), the
signal dispositions of a new interpreter, Lightning's rank-zero filter for its rank (Lightning computes it from
``RANK`` when it is imported, and the supervisor has none), numpy's global generator reseeded (a new process
seeds it from the OS; Python's ``random`` reseeds itself after a fork). It then leaves the supervisor's code
for the top of ``sprite.launch.supervisor``, which runs ``sprite.runtime`` as ``__main__`` there, so the rank
ends as an interpreter does: atexit handlers run, threads are joined, ``sys.exit`` codes kept.
Differences that remain: ``/proc/PID/cmdline`` and ``/proc/PID/environ`` show the supervisor's.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

from sprite import contract
from sprite.contract import warm

OPT_OUT = "SPRITE_FORK_RANKS"  # "0": start every rank as a fresh interpreter
WARM_MODULES = ("torch", "lightning.pytorch")
RESET = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGCHLD, signal.SIGHUP)


def wanted(cmd: list[str], environ=os.environ) -> bool:
    """Whether the ranks of ``cmd`` may be forked from this process (module docstring)."""
    if environ.get(OPT_OUT, "1") == "0" or cmd[1:3] != ["-m", "sprite.runtime"]:
        return False
    if os.path.abspath(cmd[0]) != os.path.abspath(sys.executable):
        return False
    accelerator = environ.get(contract.ACCELERATOR, "")
    if accelerator == "cpu":
        return True
    if accelerator != "auto":
        return False
    from sprite.launch import devicecount

    return devicecount.nvidia_gpus(environ) == 0 and not devicecount.intel_cards()


def server_waiting(environ=os.environ) -> bool:
    """Whether a warm server's socket is there for the ranks (sprite.contract.warm): they start as its forks."""
    import stat

    path = environ.get(warm.SERVER)
    try:
        return bool(path) and stat.S_ISSOCK(os.stat(path).st_mode)
    except OSError:
        return False


def warm_up(omp_threads: str | None, extra: tuple[str, ...] = ()) -> bool:
    """Import what every rank imports first (and ``extra``); False (ranks start fresh) when that fails.
    ``omp_threads``, the ranks' OMP_NUM_THREADS, is set here before ``import torch``: OpenMP reads it when it is
    loaded (None: each forked rank sets its own, sprite.launch.warmserver)."""
    if omp_threads is not None:
        os.environ["OMP_NUM_THREADS"] = omp_threads
    try:
        for name in (*WARM_MODULES, *extra):
            __import__(name)
    except Exception as err:  # noqa: BLE001  (any failure: the fresh ranks will show it in full)
        print(f"sprite: starting the ranks as fresh interpreters ({type(err).__name__} importing {name}).",
              file=sys.stderr, flush=True)
        return False
    import gc

    gc.freeze()  # the imported objects: the ranks' collector leaves them alone, so their pages stay shared
    return True


@dataclass
class Rank:
    """What a forked child runs once it is back at the top of the supervisor module."""

    argv: list[str]


class Forked:
    """A forked rank seen from the supervisor, with the parts of ``subprocess.Popen`` the supervisor uses."""

    def __init__(self, pid: int, stdout: int, stderr: int):
        self.pid = pid
        self.returncode: int | None = None
        self.stdout = os.fdopen(stdout, "rb")
        self.stderr = os.fdopen(stderr, "rb")

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped elsewhere: nothing more is known of it
                self.returncode = -signal.SIGKILL
                return self.returncode
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"rank pid {self.pid}", timeout)
            time.sleep(0.02)
        return self.returncode


def fork(env: dict, cmd: list[str]) -> Forked | Rank:
    """Fork one rank: in the supervisor a :class:`Forked`; in the child, set up as the module docstring says, a
    :class:`Rank` to hand back to the top of the supervisor module (the earlier ranks' pipe ends, which the child
    inherits, close as the supervisor's frames holding them go)."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        os.close(out_w)
        os.close(err_w)
        return Forked(pid, out_r, err_r)
    os.dup2(out_w, 1)
    os.dup2(err_w, 2)
    for fd in (out_r, out_w, err_r, err_w):
        os.close(fd)
    become_rank(env)
    return Rank(argv=cmd[3:])


def become_rank(env: dict) -> None:
    """In a process just forked from a warm one: become what a fresh ``python -m sprite.runtime`` with ``env``
    would be (the module docstring's list), its standard streams already in place."""
    from sprite.launch.procgroup import die_with_parent

    os.setsid()
    die_with_parent()
    for sig in RESET:
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.environ.clear()
    os.environ.update(env)
    for stream in (sys.stdout, sys.stderr):  # fresh ranks run with PYTHONUNBUFFERED=1: no line waits
        if stream is not None:
            stream.reconfigure(line_buffering=True)
    from lightning_utilities.core.rank_zero import rank_zero_only

    rank_zero_only.rank = int(env.get("RANK", "0"))
    if "numpy.random" in sys.modules:
        sys.modules["numpy.random"].seed()


def run(rank: Rank) -> None:
    """In a forked child, at the top of the supervisor module: run ``sprite.runtime`` as ``python -m`` would.
    Its ``sys.exit`` (or an exception) ends this interpreter."""
    import runpy

    sys.argv = ["-m", *rank.argv]  # runpy puts the module's path first, as -m does
    runpy.run_module("sprite.runtime", run_name="__main__", alter_sys=True)
