"""What ``sprite run`` does for a real run: plan, create the run folder, run the attempts, record the outcome."""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from dataclasses import replace
from typing import Mapping

from sprite import contract, schedulers
from sprite.integrity import audit
from sprite.launch import execute
from sprite.recovery import rundir
from sprite.errors import UsageError, one_line
from sprite.launch import folders, ranklog
from sprite.values.grammar import control_char
from sprite.launch import plan as planning
from sprite.launch.plan import LaunchPlan
from sprite.errors import EXIT_CHECK_FAILED, EXIT_USAGE, SpriteError
from sprite.recovery import requeue, summary
from sprite.recovery.loop import run_attempts
from sprite.recovery.session import Run, limits_of, said_never


def prepare(flags: dict, spec_file: str | None, run_dir: str | None, environ: Mapping[str, str] = os.environ,
            allow_literal_secrets: bool = False) -> tuple[Run, LaunchPlan]:
    """The run and the plan of its first attempt; nothing is created yet. Raises UsageError / SpecError (also for
    an ``env`` that sets sprite's own run variables, or a literal secret unless ``allow_literal_secrets``)."""
    job, _ = planning.assemble(flags, spec_file, environ, allow_literal_secrets)
    taken = sorted(set(job.env) & {contract.RUN_DIR, contract.ATTEMPT, contract.HEARTBEAT_SECONDS,
                                    contract.STACKS_AFTER})
    if taken:
        raise UsageError(f"{', '.join(taken)} cannot be set with --env or env:.", "sprite run sets it for every run.",
                         "Use --run-dir DIR to choose the run folder.")
    job_id = schedulers.discover(environ, hostname=socket.gethostname()).job_id
    path = rundir.choose(check_folders(run_dir, job), job_id)
    why = folders.problem(str(path))
    if why:
        raise UsageError(f"--run-dir {one_line(run_dir or str(path), 300)}: the run folder {why}.",
                         "sprite makes a new folder for every run (default: under ./sprite-runs/).",
                         "Pass a --run-dir that can be made, on a file system every node sees.")
    run = Run(path, flags, spec_file, environ, job.retries, limits_of(job), job.script,
              said_never(flags, spec_file), allow_literal_secrets, requeue=job.requeue)
    return run, run.plan(1, flags)


def check_folders(run_dir: str | None, job) -> str | None:
    """Refuse, before anything is made, a ``--run-dir`` holding a control character (it is printed and recorded)
    and a rank-log folder that cannot be made or holds old logs (named where it was given). Returns ``run_dir``.

    Raises UsageError.
    """
    bad = control_char(run_dir) if run_dir else None
    if bad:
        raise UsageError(f"--run-dir {one_line(run_dir, 300)} holds the control character {bad!r}.",
                         "A newline or escape in a path breaks every line that prints it.",
                         "Pass a folder name of printable characters.")
    if job.log_dir:
        ranklog.check(job.log_dir, job.origins.get("log_dir", "--log-dir"))
    return run_dir


def masked_argv(argv: list[str]) -> list[str]:
    """``argv`` with the value of every ``--env NAME=VALUE`` shown as ``NAME=***`` (it may be a secret)."""
    out, after_env = [], False
    for arg in argv:
        if after_env and "=" in arg:
            arg = arg.split("=", 1)[0] + "=***"
        elif arg.startswith("--env=") and "=" in arg[6:]:
            arg = "--env=" + arg[6:].split("=", 1)[0] + "=***"
        out.append(arg)
        after_env = arg == "--env"
    return out


def _launch_record(run: Run, plan: LaunchPlan) -> None:
    world = plan.world
    limits = run.limits
    run.record("launch", run_dir=str(run.path), argv=masked_argv(sys.argv), cwd=os.getcwd(),
               host=socket.gethostname(), pid=os.getpid(), script=run.script,
               scheduler=world.alloc.scheduler, job_id=world.alloc.job_id, allocation=list(world.alloc.hosts),
               hosts=list(world.hosts), nodes=world.nodes, world_size=world.size, launcher=world.flavour,
               retries=run.retries, stall_timeout=limits.stall if limits else None,
               first_step_timeout=limits.first_step if limits else None, save_timeout=limits.save if limits else None,
               preempt_signal=plan.env.get(contract.PREEMPT_SIGNAL, ""), requeue=run.requeue)
    restarts = schedulers.detect(run.environ).restart_count(run.environ)
    if restarts:
        run.record("requeue", job_id=world.alloc.job_id, restart_count=restarts)


def _stage(run: Run, plan: LaunchPlan, base: dict):
    """Stage the environment on every node under ``--stage`` (recorded as "stage"; the preflight and every
    attempt run the copy); returns the StagePlan to remove at the end (every node it staged, whichever the
    attempts use), or None without --stage. Raises SpriteError when staging fails (run.json and the audit trail's
    "stage" record say so)."""
    if plan.stage is None:
        return None
    from sprite.launch.stage import run as staging

    try:
        staged = staging.stage(plan.stage)
    except BaseException as err:
        said = one_line(str(err), 500)
        run.record("stage", ok=False, dir=plan.stage.dir, hosts=len(plan.stage.hosts), error=said)
        rundir.write_summary(run.path, {**base, "status": "stage failed", "error": said})
        # Removes only folders this run made (their marker names its token); --keep-stage keeps copies for a look
        # after an attempt, and none ran.
        staging.unstage(replace(plan.stage, keep=False))
        raise
    run.record("stage", ok=True, **staged)
    print(f"sprite: staged {staged['bytes'] / 1e6:.0f} MB ({'cached archive' if staged['cached'] else 'packed'} "
          f"in {staged['pack_seconds']:.1f} s, on {staged['hosts']} node(s) in {staged['broadcast_seconds']:.1f} s)"
          f" to {staged['dir']}", file=sys.stderr, flush=True)
    return plan.stage


def _preflight_unstaged(run: Run, plan: LaunchPlan, base: dict, preflight, failed: Exception):
    """Staging failed on some node (down, hung, its disk full): as before staging came first, the preflight runs
    from the installed environment to find it, and staging is tried again on the nodes it keeps. Returns (the
    first attempt's plan, the StagePlan to remove at the end), or (None, None) when the preflight stopped the run.
    Raises ``failed`` when the preflight found every node healthy, SpriteError when staging fails again."""
    print("sprite: staging failed; the preflight runs from the installed environment to find a failing node, and "
          "staging is tried again without it.", file=sys.stderr, flush=True)
    unstaged = replace(plan, stage=None)
    kept = preflight.check(run, unstaged)()
    if kept is None:
        return None, None
    if kept is unstaged:  # every node passed: the staging failure is not a node's
        raise failed
    return kept, _stage(run, kept, base)


def _checked_attempts(run: Run, plan: LaunchPlan, base: dict, preflight) -> int | None:
    """The preflight (``preflight()``, when asked for), then every attempt; returns the exit code, or None when
    the preflight stopped the run."""
    if preflight is not None:  # --preflight (sprite.cli.preflight): may leave failed nodes out, or stop (exit 1)
        try:
            plan = preflight()
        except BaseException as err:  # a port taken since the check, a Ctrl-C: run.json must not say running
            rundir.write_summary(run.path, {**base, "status": "preflight failed", "error": one_line(str(err), 500)})
            raise
        if plan is None:
            rundir.write_summary(run.path, {**base, "status": "preflight failed"})
            return None
    if plan.log_dir:  # after the run folder, which may hold it (--run-dir R --log-dir R/logs)
        ranklog.prepare(plan.log_dir)
    for note in plan.output_notes:  # where the ranks' output goes, once it can go there
        print(f"sprite: {note}", file=sys.stderr, flush=True)
    _launch_record(run, plan)
    return run_attempts(run, plan)


def run_all(run: Run, plan: LaunchPlan, preflight=None) -> int:
    """Create the run folder and the rank-log folder, stage the environment (--stage), run the preflight
    (--preflight, on the staged copy) and every attempt, remove the staged copies, write the completion record
    and run.json; returns the exit code.

    Raises UsageError when the launcher program is missing or rank 0's port on this machine is taken (before
    anything is created).
    """
    execute.check_ready(plan)
    rundir.create(run.path)
    base = {"run_dir": str(run.path), "pid": os.getpid(), "host": socket.gethostname(),
            "argv": masked_argv(sys.argv)}
    # --preflight's inputs are checked before anything is staged; it runs on the staged copy.
    try:
        checked = preflight.check(run, plan) if preflight is not None else None
    except UsageError as err:
        rundir.write_summary(run.path, {**base, "status": "preflight refused", "error": one_line(str(err), 500)})
        raise
    rundir.write_summary(run.path, {**base, "status": "running", "started": time.time()})  # staging included
    try:
        staged = _stage(run, plan, base)
    except SpriteError as err:
        if checked is None or err.exit_code == EXIT_USAGE:  # a folder not sprite's is no node's fault
            raise
        plan, staged = _preflight_unstaged(run, plan, base, preflight, err)
        rundir.write_summary(run.path, {**base, "status": "running", "started": time.time()})
        checked = lambda: plan  # noqa: E731 (the preflight has run: its plan, or None when it stopped the run)
    try:
        code = _checked_attempts(run, plan, base, checked)
    finally:
        if staged is not None:
            from sprite.launch.stage import run as staging

            # --keep-stage keeps the copies for a look after the run; when no attempt ran there is none to see.
            staging.unstage(staged if run.attempts else replace(staged, keep=False))
    if code is None:
        return EXIT_CHECK_FAILED
    last = run.attempts[-1]
    if requeue.wanted(run.requeue, last):
        # Slurm ends this batch script (SIGTERM, SIGKILL after KillWait) as soon as it requeued the job: the
        # answer and the completion record are written first.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        requeue.request(run, run.environ)
    status = summary.status_of(last["cause"])
    totals = {key: round(sum(a[key] for a in run.attempts), 6) for key in ("seconds", "node_hours", "device_hours")}
    done = run.record("completion", status=status, exit_code=code, attempts=len(run.attempts), **totals)
    result = summary.summarize(audit.read(run.trail))
    rundir.write_summary(run.path, {**base, **result, "audit_tail": done["self_sha256"]})
    print(f"sprite: run {status} after {len(run.attempts)} attempt(s), {totals['device_hours']:.4f} device-hours; "
          f"record in {run.path}", file=sys.stderr, flush=True)
    return code

