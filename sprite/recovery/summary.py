"""A run's summary (status, attempts, resumes, cost) computed from its audit records alone (a pure function)."""

from __future__ import annotations

import math

from sprite.recovery import classify

STATUS = {classify.SUCCESS: "succeeded", classify.STALL: "stalled", classify.PREEMPTION: "preempted",
          classify.INTERRUPTED: "interrupted"}


def status_of(cause: str) -> str:
    """The run status an attempt ending with ``cause`` leaves when it is the last one."""
    return STATUS.get(cause, "failed")


def summarize(records: list[dict]) -> dict:
    """Status, attempts, resumes, exit code, node- and device-hours (per attempt and in total) of one run.

    A trail without a ``completion`` record is "incomplete": the run is still going, or sprite was killed. The
    records are read as they are (an intact chain proves no accident, not who wrote it): a field of the wrong
    type counts as missing, so any trail gives a summary.
    """
    records = [r for r in records if isinstance(r, dict)]
    kinds = [r.get("kind") for r in records]
    launch = next((r for r in records if r.get("kind") == "launch"), {})
    ends = [r for r in records if r.get("kind") == "attempt_end"]
    done = next((r for r in records if r.get("kind") == "completion"), None)
    attempts = [{key: end.get(key) for key in ("attempt", "exit_code", "cause", "reason", "hosts", "world_size",
                                                "seconds", "node_hours", "device_hours")} for end in ends]
    return {
        "run_dir": _text(launch.get("run_dir")),
        "script": _text(launch.get("script")),
        "started": _text(launch.get("time")),
        "ended": _text(done.get("time")) if done else "",
        "status": _status(done.get("status")) if done else "incomplete",
        "exit_code": _int(done.get("exit_code")) if done else None,
        "attempts": kinds.count("attempt_start"),
        "resumes": len([r for r in records if r.get("kind") == "resume" and r.get("path")]),
        "stalls": kinds.count("stall"),
        "node_hours": _total(a["node_hours"] for a in attempts),
        "device_hours": _total(a["device_hours"] for a in attempts),
        "per_attempt": attempts,
    }


def _status(value) -> str:
    """A completion record's status if sprite could have written it, else "unknown"."""
    return value if value in (*STATUS.values(), "failed") else "unknown"


def _text(value) -> str:
    return value if isinstance(value, str) else ""


def _int(value):
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _total(values) -> float:
    """The sum of the finite non-negative numbers among ``values`` (anything else counts 0), rounded; a sum too
    large for a float counts 0 too."""
    total = math.fsum(_hours(value) for value in values)
    return round(total, 6) if math.isfinite(total) else 0.0


def _hours(value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return 0.0
    try:
        value = float(value)
    except OverflowError:  # an integer of hundreds of digits
        return 0.0
    return value if math.isfinite(value) and value >= 0 else 0.0
