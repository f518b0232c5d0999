"""Whether to relaunch after an attempt, and without which hosts: a pure function of the attempt's Verdict.

- success, bad usage (exit 2) and a failed check (exit 1 from sprite's own refusal): never.
- preemption and interruption: never from here; the allocation is ending or the user stopped the run (the
  scheduler's requeue starts a new ``sprite run``).
- a node fault: relaunch, without the blamed hosts when the allocation has room for them (spare nodes).
- an application fault: relaunch only if the attempt got past its first training step (a script that fails
  before it would fail again the same way), resuming from the last valid checkpoint.
- a stall: relaunch only when the heartbeats single out hosts whose ranks all fell behind the others (a node
  fault); when every rank stopped at the same step the script's own hang would recur, so the run ends with 124.
"""

from __future__ import annotations

from dataclasses import dataclass

from sprite.recovery import classify


@dataclass(frozen=True)
class Decision:
    relaunch: bool
    exclude: tuple[str, ...]  # hosts to leave out of the next attempt
    why: str


def decide(verdict: classify.Verdict, attempt: int, retries: int, progressed: bool) -> Decision:
    """What follows attempt number ``attempt`` (1-based) of a run allowed ``retries`` relaunches."""
    cause = verdict.cause
    if cause == classify.SUCCESS:
        return Decision(False, (), "the run finished")
    if cause in (classify.USAGE, classify.CHECK_FAILED):
        return Decision(False, (), f"{cause}: a relaunch would be refused the same way")
    if cause in (classify.PREEMPTION, classify.INTERRUPTED):
        return Decision(False, (), f"{cause}: the run was told to stop")
    if cause == classify.STALL and not verdict.hosts:
        return Decision(False, (), "every rank stopped at the same step: the script's own hang would recur")
    if cause == classify.APP_FAULT and not progressed:
        return Decision(False, (), "the application failed before its first training step: it would fail again")
    if attempt > retries:
        return Decision(False, (), f"no relaunch left (--retries {retries})")
    if verdict.hosts and cause in (classify.NODE_FAULT, classify.STALL):
        return Decision(True, verdict.hosts, f"{cause} on {', '.join(verdict.hosts)}")
    return Decision(True, (), cause)


def hours(seconds: float, nodes: int, ranks: int) -> dict:
    """Node-hours and device-hours (one device per rank) of an attempt that held its hosts for ``seconds``."""
    return {"seconds": round(seconds, 3), "node_hours": round(nodes * seconds / 3600, 6),
            "device_hours": round(ranks * seconds / 3600, 6)}
