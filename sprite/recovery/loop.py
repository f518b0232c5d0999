"""``sprite run`` as the parent of its launches: one attempt after another until the policy says stop.

Each attempt (``attempt.run_one``) runs the LaunchPlan as a child with the run folder and attempt number in its
environment; sprite reads the ranks' heartbeats, stops a stalled launch (exit 124), classifies how the attempt
ended, and relaunches when the policy says so (``--retries``), with the failed host excluded when the
allocation has room, resuming with ``SPRITE_RESUME=auto``. Every step is a record in ``audit.jsonl``.
"""

from __future__ import annotations

import sys

from sprite.launch.plan import LaunchPlan
from sprite.recovery import attempt, child, policy
from sprite.recovery.session import Run


def _say(text: str) -> None:
    print(f"sprite: {text}", file=sys.stderr, flush=True)


def run_attempts(run: Run, plan: LaunchPlan) -> int:
    """Run attempts until one succeeds or the policy stops; returns the exit code of the last attempt.

    Raises UsageError when the launcher program is missing.
    """
    flags, number = run.flags, 1
    with child.Forwarding() as signals:
        while True:
            ended, verdict = attempt.run_one(run, plan, number, signals)
            decision = policy.decide(verdict, number, run.retries, ended["progressed"])
            if decision.relaunch and signals.stopping:
                decision = policy.Decision(False, (), "sprite was told to stop")
            run.attempts.append(ended)
            if not decision.relaunch:
                run.record("attempt_end", **ended, next=f"stop: {decision.why}")
                return ended["exit_code"]
            plan, flags, where = run.next_plan(plan, flags, number + 1, decision.exclude)
            starts = "from scratch (--resume never)" if run.keep_never else "from the last valid checkpoint"
            run.record("attempt_end", **ended, next=f"relaunch {where}: {decision.why}")
            _say(f"attempt {number} ended with exit code {ended['exit_code']} ({verdict.cause}: {verdict.reason}); "
                 f"relaunching {where} as attempt {number + 1} of {run.retries + 1}, starting {starts}.")
            number += 1
