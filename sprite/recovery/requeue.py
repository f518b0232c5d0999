"""``sprite run --requeue``: after every rank saved a checkpoint and stopped for preemption (exit 75), ask the batch
system to run this job again, and record what it answered in the run's audit trail.

The job script passes ``--requeue`` and ``--resume auto`` when its spec says ``requeue: true``, so the run that
comes back continues from that checkpoint. How to ask is the scheduler module's business
(``Scheduler.requeue_argv``: Slurm requeues the job itself, PBS submits the script again).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from typing import Mapping

from sprite import schedulers
from sprite.errors import EXIT_PREEMPTED, SpriteError, UsageError, report
from sprite.recovery import classify

TIMEOUT = 120.0  # seconds the scheduler's client may take


def wanted(requeue: bool, attempt: dict) -> bool:
    """Whether the run asked for a requeue and its last attempt stopped for preemption with a checkpoint."""
    return requeue and attempt["cause"] == classify.PREEMPTION and attempt["exit_code"] == EXIT_PREEMPTED


def _program(name: str) -> str:
    found = shutil.which(name)
    if not found:
        raise UsageError(f"The scheduler command '{name}' is not on PATH inside the job.",
                         "The job's environment lost the scheduler's client commands.",
                         "Add the module that provides them to the spec's setup lines.")
    return found


def request(run, environ: Mapping[str, str]) -> bool:
    """Ask the batch system of ``environ`` to run this job again; True when it accepted. Records ``requeue``."""
    scheduler = schedulers.detect(environ)
    try:
        argv = scheduler.requeue_argv(environ, _program)
        done = subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=TIMEOUT)
        answer = (done.stdout + done.stderr).strip()[-500:]
        accepted, code = done.returncode == 0, done.returncode
    except (SpriteError, OSError, subprocess.TimeoutExpired) as err:
        argv, answer, accepted, code = [], str(err), False, None
    run.record("requeue", requested=True, accepted=accepted, scheduler=scheduler.name,
               job_id=environ.get("SLURM_JOB_ID") or environ.get("PBS_JOBID", ""), command=argv, exit_code=code,
               answer=answer)
    if accepted:
        print(f"sprite: asked {scheduler.label} to run this job again ({' '.join(argv)}); it resumes from the "
              "preemption checkpoint.", file=sys.stderr, flush=True)
    else:
        print(report(SpriteError(f"The requeue was refused: {answer or 'no answer'}.",
                                 "The job was submitted without requeue, or the scheduler's client failed.",
                                 "Submit the job again; --resume auto continues from the checkpoint.")),
              file=sys.stderr, flush=True)
    return accepted
