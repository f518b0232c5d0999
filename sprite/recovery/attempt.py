"""One attempt of a run: launch the plan as a child, watch the heartbeats, and say how it ended and what it cost."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from sprite import contract
from sprite.launch import execute
from sprite.contract import heartbeat
from sprite.recovery import rundir
from sprite.errors import EXIT_PREEMPTED, EXIT_STALLED, SpriteError, one_line, report
from sprite.launch.plan import LaunchPlan
from sprite.recovery import child, classify, hang, policy
from sprite.recovery.session import Run
from sprite.recovery.watchdog import FAILED_GRACE, Stall, Watch, heartbeat_seconds, summarize

STOP_GRACE = 5.0  # seconds between SIGTERM and SIGKILL when sprite stops a stalled launch
SIGNAL_GRACE = 30.0  # seconds a launch gets after a forwarded SIGINT/SIGTERM before SIGKILL
LOG_TAIL = 1 << 20  # the classifier reads the last MiB of an attempt's log


class Watcher:
    """The child runner's tick: reads the heartbeats every ``poll`` seconds and answers a stop line on a stall."""

    def __init__(self, run: Run, where: Path, world_size: int, log: Path | None = None,
                 stacks: Path | None = None) -> None:
        self.where, self.log, self.poll = where, log, heartbeat_seconds(run.limits) / 2
        self.watch = Watch(run.limits, world_size, time.monotonic())
        self.stall: Stall | None = None
        self.failure: str | None = None  # the stop line once a failed rank's peers outlived FAILED_GRACE
        self.stacks, self.diagnosis = stacks, None
        self._next = 0.0

    def __call__(self) -> str | None:
        now = time.monotonic()
        if now < self._next:
            return None
        self._next = now + self.poll
        beats = heartbeat.read_all(self.where)
        self.stall = self.watch.observe(beats, now, self._output())
        if not self.stall:  # none once a rank failed: then its error is the cause
            self.failure = self.watch.failure_overdue(beats, now)
            # Not "sprite: error:", which the classifier takes for a rank's own refusal: the failing rank's error,
            # already in the log, is the attempt's cause.
            return f"sprite: {self.failure}" if self.failure else None
        stop = [report(SpriteError(self.stall.message()))]
        if self.stacks is not None:  # where every rank was: the ranks dumped their own stacks (issue 27)
            try:
                self.diagnosis = hang.collect(self.stacks, self.watch.world_size,
                                              {r: b.host for r, b in beats.items()},
                                              done=frozenset(r for r, b in beats.items() if b.phase == heartbeat.DONE))
                stop += hang.lines(self.diagnosis, self.stacks)
            except Exception as err:  # noqa: BLE001 (a fault of the diagnosis never keeps sprite from stopping the run)
                stop.append(f"sprite: stall: no diagnosis ({type(err).__name__}: {one_line(str(err), 200)}); "
                            f"the ranks' stacks are in {self.stacks}/")
        return "\n".join(stop)

    def _output(self) -> int | None:
        """Bytes the launch has printed so far (its log), None when unknown: the watchdog's output fallback."""
        try:
            return os.path.getsize(self.log) if self.log else None
        except OSError:
            return None


def _diagnosis_fields(watcher: Watcher, run_path: Path) -> dict:
    """The stall record's hang diagnosis: one line per group of ranks, the likely culprits, the stack folder."""
    found = watcher.diagnosis
    if found is None or watcher.stacks is None:
        return {}
    return {"diagnosis": list(found.lines), "culprits": list(found.culprits), "culprit_reason": found.reason,
            "stacks": str(watcher.stacks.relative_to(run_path))}


def _unfinished(verdict: classify.Verdict, beats: dict) -> classify.Verdict:
    """A success whose heartbeats show ranks that never finished the script is no success."""
    left = {rank: beat for rank, beat in beats.items() if beat.phase != heartbeat.DONE}
    if verdict.cause != classify.SUCCESS or not left:
        return verdict
    return classify.Verdict(classify.APP_FAULT, f"the launcher exited 0 while {summarize(left, 0)}")


def _tail(path: Path) -> str:
    with open(path, "rb") as log:
        log.seek(max(0, os.path.getsize(path) - LOG_TAIL))
        return log.read().decode(errors="replace")


def _preempted(beats: dict, world_size: int) -> bool:
    """Every rank said it stopped for preemption: the launcher's code may say otherwise when it killed the last
    ranks to leave (srun --kill-on-bad-exit, Hydra's clean-up) after the first exited 75."""
    return len(beats) == world_size and all(beat.phase == heartbeat.PREEMPTED for beat in beats.values())


def _verdict(code: int, log_path: Path, plan: LaunchPlan, beats: dict,
             stall: Stall | None = None) -> tuple[int, classify.Verdict]:
    world = plan.world
    if code != EXIT_PREEMPTED and _preempted(beats, len(world.hosts) * world.devices):
        print(f"sprite: every rank stopped for preemption (launcher exit code {code}); exit code {EXIT_PREEMPTED}.",
              file=sys.stderr, flush=True)
        code = EXIT_PREEMPTED
    failed = sorted(rank for rank, beat in beats.items() if beat.phase == heartbeat.FAILED)
    if code == EXIT_PREEMPTED and failed:
        verdict = classify.failed_in_preemption(failed, _tail(log_path))
        print(report(SpriteError(f"The launcher exited {code} (preemption), but {verdict.reason.rstrip('.')}.",
                                 "Its save of the preemption checkpoint failing (a full disk) is the usual cause.",
                                 "Fix what that rank's lines above say, then --resume auto takes the newest valid "
                                 "checkpoint; exit code 1.")), file=sys.stderr, flush=True)
        return 1, verdict
    # A stall's suspect hosts come from the watchdog's Stall, never from its line in the log (cut when long).
    rank_hosts = [h for h in world.hosts for _ in range(world.devices)]
    verdict = _unfinished(classify.classify(code, _tail(log_path), rank_hosts,
                                            stall.suspect_hosts if stall else None), beats)
    if code == 0 and verdict.cause != classify.SUCCESS:
        print(report(SpriteError(f"the launcher exited 0, but the run did not finish: {verdict.reason}.")),
              file=sys.stderr, flush=True)
        code = 1  # srun exits 0 after "Node failure on HOST" (seen here, Slurm 22.05)
    return code, verdict


def run_one(run: Run, plan: LaunchPlan, number: int, signals: child.Forwarding) -> tuple[dict, classify.Verdict]:
    """Run attempt ``number`` to its end; returns its record fields (exit code, cause, cost, ...) and Verdict.

    Raises UsageError when the launcher program is missing, OSError when it cannot be started.
    """
    world = plan.world
    log_path = run.path / f"attempt-{number}.log"
    stacks = rundir.attempt_stacks(run.path, number) if run.limits else None
    watcher = Watcher(run, rundir.attempt_heartbeats(run.path, number), world.size, log_path, stacks)
    started, wall = time.monotonic(), time.time()
    run.record("attempt_start", attempt=number, hosts=list(world.hosts), nodes=world.nodes, world_size=world.size,
               launcher=world.flavour, resume=plan.env.get(contract.RESUME, ""), log=log_path.name)
    argv = [execute.resolve_program(plan), *plan.argv[1:]]
    outcome = child.run(argv, execute.environment(plan), plan.cwd, log_path, watcher, signals,
                        (STOP_GRACE, SIGNAL_GRACE), poll=min(0.5, watcher.poll))
    beats = heartbeat.read_all(watcher.where)
    watcher.watch.observe(beats, time.monotonic())
    stall = watcher.stall if outcome.stopped_by else None
    code, verdict = _verdict(EXIT_STALLED if stall else outcome.code, log_path, plan, beats, stall)
    if watcher.failure and outcome.stopped_by and not stall:
        run.record("failure_stop", attempt=number, reason=watcher.failure, grace_seconds=FAILED_GRACE)
    if stall:
        run.record("stall", attempt=number, idle_seconds=round(stall.idle, 1), limit_seconds=stall.limit,
                   allowance=stall.allowance, ranks=stall.summary, suspect_hosts=list(stall.suspect_hosts),
                   **_diagnosis_fields(watcher, run.path))
    if verdict.cause == classify.PREEMPTION and code != EXIT_PREEMPTED:  # at 75 rank 0 recorded it (preempt.py)
        run.record("preemption", attempt=number, reason=verdict.reason)
    cost = policy.hours(time.monotonic() - started, world.nodes, world.size)
    return {"attempt": number, "exit_code": code, "cause": verdict.cause, "reason": verdict.reason,
            "blamed_hosts": list(verdict.hosts), "hosts": list(world.hosts), "nodes": world.nodes,
            "world_size": world.size, "progressed": watcher.watch.progressed, "started": wall, **cost}, verdict
