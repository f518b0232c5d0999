"""``sprite runs goodput RUN... [--json]``: where the device-hours of a run (and of every run of its batch job)
went. Torch-free: reads ``audit.jsonl`` and the heartbeat files (``sprite.recovery.goodput``)."""

from __future__ import annotations

import json
from pathlib import Path

from sprite.errors import UsageError
from sprite.recovery import goodput, rundir

LABELS = {"productive": "productive (steps that count)", "lost_work": "lost work (after the last checkpoint)",
          "restart": "restart (relaunch to first step)", "checkpoint_stall": "checkpoint stall",
          "stall_wait": "stall wait (hang to its end)", "other": "other (first start-up, detection, teardown)"}


def folders(args: list[str]) -> list[Path]:
    """The run folders to account for: each RUN given, with the other runs of its batch job. Raises UsageError."""
    if not args:
        raise UsageError("sprite runs goodput takes a run folder.", "", "Write: sprite runs goodput RUN [--json]")
    found: list[Path] = []
    for arg in args:
        run = Path(arg)
        if not (run / rundir.AUDIT).is_file():
            raise UsageError(f"{arg} holds no audit trail ({rundir.AUDIT}).", "It is not a sprite run folder.",
                             "Pass a folder that sprite run created (sprite runs lists them).")
        found += [p for p in goodput.job_runs(run) if p not in found]
    return found


def report(args: list[str]) -> dict:
    """The goodput report of the runs named in ``args``. Raises UsageError, IntegrityError (a damaged trail)."""
    runs = [goodput.load(path) for path in folders(args)]
    runs.sort(key=lambda run: str(run[0][0].get("time", "")) if run[0] else "")
    return goodput.account(runs)


def text(result: dict, runs: int) -> str:
    hours = result["device_hours"]
    total = hours["total"] or 1.0
    lines = [f"{LABELS[key]:<45} {hours[key]:>12.6f}  {100 * hours[key] / total:5.1f}%" for key in goodput.CATEGORIES]
    head = f"{'device-hours' + (f' ({runs} runs of one job)' if runs > 1 else ''):<45} {hours['total']:>12.6f}"
    return "\n".join([head, *lines, f"goodput {100 * result['goodput']:.1f}%"])


def main(args: list[str], json_out: bool) -> str:
    result = report(args)
    return json.dumps(result) if json_out else text(result, len(folders(args)))
