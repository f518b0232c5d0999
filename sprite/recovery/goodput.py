"""Where a run's device-hours went (``sprite runs goodput``): a pure split of each attempt's time, from the audit
records and the last heartbeat of each rank.

Each attempt held ``world_size`` devices from its ``started`` wall time for ``seconds`` (its ``attempt_end``
record). Within it, from the records rank 0 appends (``first_step``: the wall time of the first training step;
``checkpoint_written``: the step, the stall and the wall time training went on after each save) and the ranks'
last heartbeats (the last step and when it was reached):

- ``restart``: from a relaunch to its first step (start-up, imports, resume load): every attempt after the first,
  the first attempt of a requeued run, and any attempt that resumed from a checkpoint. The first start-up of a
  run started from scratch is ``other``.
- ``checkpoint_stall``: the time the training loop waited for each save (``stall_seconds``).
- ``lost_work``: in an attempt that did not succeed (a failure, a stall, a preemption), the training time after
  the last sealed checkpoint of the attempt (or, with none, after its first step) up to its last progress: steps
  that are redone, or never counted. Nothing when that checkpoint holds the last step (a preemption save); the
  attempt's training then ends when that save returned, and its background write and the ranks' exit are other.
- ``stall_wait``: in a stalled attempt, from the last progress to the attempt's end.
- ``productive``: the rest of the time from the first step to the last progress.
- ``other``: what is left (the first start-up, the time from a crash to its detection, the end of a fit), so the
  categories sum to the total exactly.

An attempt without a ``first_step`` record never trained (or ran no Lightning Trainer fit): all of it is restart
(a relaunch) or other. An attempt without an ``attempt_end`` record (still running) is left out.
Records of the wrong type count as missing; any trail gives an answer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from sprite.contract import heartbeat
from sprite.integrity import IntegrityError, audit
from sprite.recovery import classify, rundir

CATEGORIES = ("productive", "lost_work", "restart", "checkpoint_stall", "stall_wait", "other")


@dataclass
class Save:
    step: int
    resumed_at: float  # wall time the training loop went on after the save
    stall: float
    sealed: bool


@dataclass
class Attempt:
    number: int
    started: float = 0.0
    seconds: float = 0.0
    world_size: int = 0
    cause: str = ""
    first: float | None = None  # wall time of the first training step
    resumed: bool = False  # it resumed from a checkpoint
    saves: list = field(default_factory=list)
    ended: bool = False


def _num(value) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def attempts(records: list[dict]) -> list[Attempt]:
    """The attempts of one run's records, each with what happened between its start and end records."""
    found: dict[int, Attempt] = {}
    current = None
    for record in (r for r in records if isinstance(r, dict)):
        kind, number = record.get("kind"), record.get("attempt")
        if kind == "attempt_start" and isinstance(number, int):
            current = found.setdefault(number, Attempt(number))
        elif current is None:
            continue
        elif kind == "first_step" and current.first is None:
            current.first = _num(record.get("wall"))
        elif kind == "resume" and record.get("path"):
            current.resumed = True
        elif kind == "checkpoint_written" and _num(record.get("resumed_at")) is not None:
            current.saves.append(Save(record.get("step") if isinstance(record.get("step"), int) else -1,
                                      _num(record["resumed_at"]), max(_num(record.get("stall_seconds")) or 0.0, 0),
                                      record.get("verified") is True))
        elif kind == "attempt_end" and number == current.number:
            current.started = _num(record.get("started")) or 0.0
            current.seconds = max(_num(record.get("seconds")) or 0.0, 0.0)
            size = record.get("world_size")
            current.world_size = size if isinstance(size, int) and size > 0 else 0
            current.cause, current.ended = str(record.get("cause", "")), True
    return [a for a in found.values() if a.ended]


def marks(attempt: Attempt, beats: list) -> dict | None:
    """The wall times that split ``attempt``: ``first`` step, ``last`` progress, ``lost_from`` (None: nothing
    lost) and the ``saves`` in between; None when it never trained."""
    start, stop, first = attempt.started, attempt.started + attempt.seconds, attempt.first
    if first is None or not start <= first <= stop:
        return None
    last = min(max(max((b.time for b in beats), default=stop), first), stop)
    last_step = max((b.step for b in beats), default=-1)
    saves = [s for s in attempt.saves if first <= s.resumed_at <= last + 1e-3]
    lost_from = None
    if attempt.cause != classify.SUCCESS:
        sealed = [s for s in saves if s.sealed]
        base = sealed[-1] if sealed else None
        if base is not None and base.step >= last_step:  # it holds the last step (a preemption save)
            last = base.resumed_at  # what follows (the background write, leaving) is the end of the attempt
        else:
            lost_from = base.resumed_at if base else first
    return {"first": first, "last": last, "lost_from": lost_from, "saves": saves}


def split(attempt: Attempt, beats: list, relaunch: bool) -> dict:
    """Seconds of ``attempt`` per category (module docstring); ``beats``: its ranks' last Beats."""
    out = dict.fromkeys(CATEGORIES, 0.0)
    head = "restart" if relaunch or attempt.resumed else "other"
    times = marks(attempt, beats)
    if times is None:
        out[head] = attempt.seconds
        return out
    first, last, since, saves = times["first"], times["last"], times["lost_from"], times["saves"]
    stall = min(math.fsum(s.stall for s in saves), last - first)
    lost = 0.0
    if since is not None:
        lost = max(0.0, last - since - math.fsum(s.stall for s in saves if s.resumed_at > since))
    lost = min(lost, last - first - stall)
    out[head] = first - attempt.started
    out["checkpoint_stall"] = stall
    out["lost_work"] = lost
    out["productive"] = max(0.0, last - first - stall - lost)
    if attempt.cause == classify.STALL:
        out["stall_wait"] = attempt.started + attempt.seconds - last
    out["other"] += max(0.0, attempt.seconds - math.fsum(out[c] for c in CATEGORIES))
    return out


def account(runs: list[tuple[list[dict], dict]]) -> dict:
    """The goodput report of one job's runs, oldest first: ``(records, {attempt: [Beat, ...]})`` each. Device-hours
    per category (summing to ``total``) and ``goodput`` = productive / total."""
    hours = dict.fromkeys(CATEGORIES, 0.0)
    for index, (records, beats) in enumerate(runs):
        for attempt in attempts(records):
            parts = split(attempt, list(beats.get(attempt.number, [])), relaunch=index > 0 or attempt.number > 1)
            for key, seconds in parts.items():
                hours[key] += seconds * attempt.world_size / 3600
    rounded = {key: round(value, 9) for key, value in hours.items()}
    total = round(math.fsum(hours.values()), 9)
    goodput = round(hours["productive"] / math.fsum(hours.values()), 4) if total > 0 else 0.0
    return {"device_hours": {"total": total, **rounded}, "goodput": goodput}


def load(run: Path) -> tuple[list[dict], dict]:
    """One run folder's records and its ranks' last heartbeats by attempt. Raises IntegrityError, OSError."""
    records = audit.read(run / rundir.AUDIT)
    numbers = {r.get("attempt") for r in records if r.get("kind") == "attempt_start"}
    beats = {n: list(heartbeat.read_all(heartbeat.folder(run, n)).values()) for n in numbers if isinstance(n, int)}
    return records, beats


def job_of(records: list[dict]) -> tuple[str, str] | None:
    """(scheduler, job id) of a run started inside a batch job, else None."""
    launch = next((r for r in records if r.get("kind") == "launch"), {})
    job, scheduler = launch.get("job_id"), launch.get("scheduler")
    return (str(scheduler), job) if isinstance(job, str) and job else None


def _next_jobs(records: list[dict]) -> set[str]:
    """Job ids a run's accepted requeue named in the scheduler's answer: PBS submits the script again as a new
    job (``qsub`` prints its id), Slurm keeps the id."""
    answers = [r.get("answer") for r in records if r.get("kind") == "requeue" and r.get("accepted") is True]
    return {token for answer in answers if isinstance(answer, str) for token in answer.split()}


def job_runs(run: Path) -> list[Path]:
    """``run`` and every run folder beside it from the same batch job, oldest launch first: the same scheduler
    and job id (Slurm requeues keep it), or linked by a requeue that submitted the job again under a new id (PBS),
    either way round."""
    here = audit.read(run / rundir.AUDIT)
    if job_of(here) is None:
        return [run]
    found = {}
    for other in sorted(run.parent.iterdir()):
        trail = other / rundir.AUDIT
        if other.is_symlink() or not trail.is_file():
            continue
        try:
            found[other] = audit.read(trail)
        except (OSError, IntegrityError):
            continue
    found[run] = here
    group, grew = {run}, True
    while grew:  # every run linked to one in the group, until nothing new joins
        jobs = {job_of(found[path]) for path in group}
        nexts = set().union(*(_next_jobs(found[path]) for path in group))
        joined = {path for path, records in found.items() if path not in group and job_of(records) is not None and
                  (job_of(records) in jobs or job_of(records)[1] in nexts or
                   {job[1] for job in jobs} & _next_jobs(records))}
        group, grew = group | joined, bool(joined)
    return sorted(group, key=lambda path: (str(found[path][0].get("time", "")) if found[path] else "", str(path)))
