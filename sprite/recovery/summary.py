"""A run's summary (status, attempts, resumes, cost) computed from its audit records alone (a pure function)."""

from __future__ import annotations

from sprite.recovery import classify

STATUS = {classify.SUCCESS: "succeeded", classify.STALL: "stalled", classify.PREEMPTION: "preempted",
          classify.INTERRUPTED: "interrupted"}


def status_of(cause: str) -> str:
    """The run status an attempt ending with ``cause`` leaves when it is the last one."""
    return STATUS.get(cause, "failed")


def summarize(records: list[dict]) -> dict:
    """Status, attempts, resumes, exit code, node- and device-hours (per attempt and in total) of one run.

    A trail without a ``completion`` record is "incomplete": the run is still going, or sprite was killed.
    """
    launch = next((r for r in records if r["kind"] == "launch"), {})
    ends = [r for r in records if r["kind"] == "attempt_end"]
    done = next((r for r in records if r["kind"] == "completion"), None)
    attempts = [{key: end.get(key) for key in ("attempt", "exit_code", "cause", "reason", "hosts", "world_size",
                                                "seconds", "node_hours", "device_hours")} for end in ends]
    return {
        "run_dir": launch.get("run_dir", ""),
        "script": launch.get("script", ""),
        "started": launch.get("time", ""),
        "ended": done["time"] if done else "",
        "status": done["status"] if done else "incomplete",
        "exit_code": done["exit_code"] if done else None,
        "attempts": len([r for r in records if r["kind"] == "attempt_start"]),
        "resumes": len([r for r in records if r["kind"] == "resume" and r.get("path")]),
        "stalls": len([r for r in records if r["kind"] == "stall"]),
        "node_hours": round(sum(a["node_hours"] or 0 for a in attempts), 6),
        "device_hours": round(sum(a["device_hours"] or 0 for a in attempts), 6),
        "per_attempt": attempts,
    }
