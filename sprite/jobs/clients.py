"""Running a scheduler's client commands (qsub, sbatch, qstat, squeue, scontrol, qdel, scancel), and with them
``sprite status`` and ``sprite cancel``.

Every call is an argument list (never a shell), has a deadline (a hung client must not hang sprite), reads its
output as UTF-8 with undecodable bytes replaced, and turns every failure into one bounded line.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess

from sprite import schedulers
from sprite.spec import sites
from sprite.errors import SpriteError, UsageError, one_line
from sprite.schedulers.base import Scheduler

TIMEOUT = 60.0  # seconds; a healthy login node answers in well under a second, a busy one in a few


class ClientTimeout(UsageError):
    """A client did not answer in time; a submission may or may not have gone through."""


class ClientInterrupted(SpriteError):
    """sprite was interrupted (Ctrl-C) while a submit command ran; the job may or may not exist."""

    exit_code = 130


def program(name: str, scheduler: Scheduler) -> str:
    """The full path of the scheduler command ``name``. Raises UsageError when it is not on PATH."""
    found = shutil.which(name)
    if not found:
        raise UsageError(f"The {scheduler.name.upper()} command '{name}' is not on PATH.",
                         f"{scheduler.client_hint}; this machine has none.",
                         "Run this on the site's login node, or use --dry-run to print the job script.")
    return found


def call(argv: list[str], what: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``argv`` with the deadline TIMEOUT; stdout and stderr come back as text. ``env`` (a submit command's)
    also sets umask 077, so what the batch system writes for the job is owner-only.

    The client runs in its own process group, so on timeout it and everything it started are killed.
    Raises ClientTimeout after TIMEOUT seconds, UsageError when the program cannot be started.
    """
    try:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True, env=env, umask=0o077 if env is not None else -1)
    except OSError as err:
        raise UsageError(f"{what} could not be started ({err.strerror or err}).",
                         "The client on PATH is broken, not executable or not a program.",
                         "Fix PATH or load the site's scheduler module.") from None
    try:
        out, err = proc.communicate(timeout=TIMEOUT)
    except BaseException as exc:
        _stop(proc)
        if isinstance(exc, subprocess.TimeoutExpired):
            raise ClientTimeout(f"{what} did not answer within {TIMEOUT:g} s.",
                                "The scheduler is overloaded or cannot be reached from here.",
                                "Try again in a while; check the queue with the scheduler's own client first.",
                                ) from None
        raise
    return subprocess.CompletedProcess(argv, proc.returncode, _text(out), _text(err))


def _stop(proc: subprocess.Popen) -> None:
    """Kill the client's process group (it was started in its own session) and collect it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        proc.communicate(timeout=5)
    except subprocess.TimeoutExpired:  # a grandchild left the group and still holds the pipes: stop waiting
        proc.stdout.close()
        proc.stderr.close()
        proc.wait()


def _text(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def run(argv: list[str], what: str | None, env: dict | None = None) -> subprocess.CompletedProcess:
    """``call`` argv; when ``what`` is given, raise UsageError naming it if the command fails (its last line)."""
    done = call(argv, what or os.path.basename(argv[0]), env)
    if what is not None and done.returncode != 0:
        detail = (done.stderr or done.stdout).strip().splitlines()
        last = one_line(detail[-1], 300) if detail else "no output"
        raise UsageError(f"{what} failed (exit {done.returncode}): {last}.",
                         "The scheduler refused the request or is not reachable from here.",
                         "Fix what its message names (the spec or the job id), or run this on the site's login node.")
    return done


def pick(name: str | None, site_name: str | None) -> Scheduler:
    """The batch system to ask: the flag, else the site's, else whichever client is on PATH."""
    if name:
        return schedulers.get(name)
    site_scheduler = schedulers.get(sites.load(site_name).scheduler) if site_name else None
    if site_scheduler is not None and site_scheduler.submit_program:
        return site_scheduler
    for scheduler in schedulers.by_client_probe():
        if shutil.which(scheduler.status_program):
            return scheduler
    clients_text = " nor ".join(f"{s.status_program} ({s.label})" for s in schedulers.by_client_probe())
    raise UsageError(f"Neither {clients_text} is on PATH.", "This machine has no scheduler client.",
                     "Run this on a login node of the site that runs the job, or pass --scheduler.")


def status(job_id: str, scheduler: Scheduler) -> str:
    """The scheduler's view of ``job_id``, control characters escaped (a job name may hold a terminal escape).
    Raises UsageError when the command is missing or knows no such job."""
    text = scheduler.status(job_id, run, lambda name: program(name, scheduler))
    return "\n".join(one_line(row, 1000) for row in text.splitlines())


def cancel(job_id: str, scheduler: Scheduler) -> None:
    """Cancel ``job_id``. Raises UsageError when the command is missing or refuses."""
    argv = scheduler.cancel_argv(job_id, lambda name: program(name, scheduler))
    run(argv, f"{os.path.basename(argv[0])} {job_id}")


def status_record(job_id: str, scheduler: Scheduler) -> dict:
    """``job_id`` as one record read from the scheduler's own JSON (``sprite status --json``).
    Raises UsageError when the command is missing or knows no such job, ClientTimeout past the deadline."""
    return scheduler.status_record(job_id, run, lambda name: program(name, scheduler))
