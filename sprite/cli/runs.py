"""``sprite runs [DIR] [--json]`` lists run folders; ``sprite runs verify RUN`` checks a run's audit trail.

Torch-free: both read only ``audit.jsonl`` and ``run.json``.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import List, Optional

import typer

from sprite.integrity import audit
from sprite.integrity import canonical, records
from sprite.recovery import rundir
from sprite.errors import UsageError
from sprite.integrity import IntegrityError
from sprite.recovery import hang, summary

HELP = """List the runs in DIR (default ./sprite-runs), or verify one run's audit trail.

Examples:

\b
  sprite runs                      # status, attempts, resumes, device-hours of each run
  sprite runs DIR --json
  sprite runs verify RUN           # exit 0: trail intact; 1: edited or truncated, with the reason
  sprite runs show RUN             # one run: its summary, where every rank was at a stall, its goodput
  sprite runs goodput RUN --json   # device-hours: productive, lost work, restart, checkpoint stall, ...
  sprite runs plot RUN tl.png      # the goodput timeline as a PNG (the plot extra)
"""


PID_MAX = 1 << 22  # Linux's PID_MAX_LIMIT: no process id is larger


def _alive(info: dict) -> bool:
    """Whether the sprite process named in run.json still runs (only knowable on its own host). Only a real
    process id counts: 0 and -1 would ask ``kill`` about a whole process group or every process."""
    pid = info.get("pid")
    if not isinstance(info.get("host"), str) or info["host"] != socket.gethostname() or \
            type(pid) is not int or not 0 < pid <= PID_MAX:
        return False
    try:
        os.kill(pid, 0)
    except PermissionError:
        return True
    except OSError:  # ProcessLookupError: gone
        return False
    return True


def _read_json(path: Path) -> dict:
    """run.json as an object; {} when it is missing, not a regular file, too large, not JSON or not an object."""
    try:
        found = records.read_json(path, records.SUMMARY_MAX)
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


def describe(run: Path) -> dict:
    """One run's summary; an unreadable or edited trail gives status "damaged" and the reason."""
    try:
        result = summary.summarize(audit.read(run / rundir.AUDIT))
    except (IntegrityError, OSError) as err:
        return {"run_dir": str(run), "status": "damaged", "reason": str(err), "attempts": None, "resumes": None,
                "device_hours": None, "node_hours": None, "started": ""}
    if result["status"] == "incomplete" and _alive(_read_json(run / rundir.SUMMARY)):
        result["status"] = "running"
    return {**result, "run_dir": str(run)}


def list_runs(parent: Path) -> list[dict]:
    """Summaries of every run folder (a folder holding audit.jsonl) in ``parent``, oldest first.

    Raises UsageError when ``parent`` is not a folder.
    """
    if not parent.is_dir():
        raise UsageError(f"{parent} is not a folder.", "sprite run puts its runs in ./sprite-runs by default.",
                         "Pass the folder that holds the run folders.")
    runs = sorted(p for p in parent.iterdir() if (p / rundir.AUDIT).is_file() and not p.is_symlink())
    return [describe(run) for run in runs]


def verify(run: Path) -> str:
    """``"N records"`` for an intact trail. Raises IntegrityError (exit 1) naming what is wrong, UsageError (exit 2)
    when ``run`` holds no audit trail."""
    trail = run / rundir.AUDIT if run.is_dir() else run
    if not trail.is_file() or trail.name != rundir.AUDIT:
        raise UsageError(f"{run} holds no audit trail ({rundir.AUDIT}).", "It is not a sprite run folder.",
                         "Pass a folder that sprite run created (sprite runs lists them).")
    ok, reason = audit.verify(trail)
    summary_file = trail.parent / rundir.SUMMARY
    said = _read_json(summary_file)
    if ok and trail.stat().st_size == 0:
        ok, reason = False, "it holds no record (sprite writes the launch first)"
    elif ok and not said:  # sprite writes run.json before the first record, and rewrites it at the end
        ok, reason = False, (f"{rundir.SUMMARY} is missing or unreadable, so lines removed from the end of the trail "
                             "cannot be ruled out")
    elif ok:
        tail = said.get("audit_tail")
        tail = tail if isinstance(tail, str) else None
        try:
            found = audit.read(trail) if tail else []
        except OSError as err:  # changed since audit.verify read it
            raise IntegrityError(f"Cannot read the audit trail {trail}: {err.strerror or err}.", "It changed while"
                                 " being verified.", "Run sprite runs verify again.") from None
        last = found[-1][canonical.SELF] if found else None
        if tail and last != tail:
            ok, reason = False, (f"the trail ends before its completion record (run.json names {tail[:12]}..., the "
                                 f"last line is {str(last)[:12]}...): lines were removed from the end")
        elif not tail:
            reason += " (no completion record yet: the run is still running, or was stopped before it ended)"
    if not ok and not os.access(trail, os.R_OK):
        raise UsageError(f"The audit trail {trail} cannot be verified: {reason}.", "It is not readable by you.",
                         "Run sprite runs verify as the run's owner.")
    if not ok:
        raise IntegrityError(f"The audit trail {trail} is not intact: {reason}.", "It was edited or truncated after"
                             " sprite wrote it.", "Keep it as evidence; the run's record cannot be trusted.")
    return reason


def show(run: Path, json_out: bool = False) -> str:
    """One run: its summary, then each stall with where every rank was (the hang diagnosis). Raises
    UsageError when ``run`` holds no audit trail, IntegrityError when the trail cannot be read."""
    if not (run / rundir.AUDIT).is_file():
        raise UsageError(f"{run} holds no audit trail ({rundir.AUDIT}).", "It is not a sprite run folder.",
                         "Pass a folder that sprite run created (sprite runs lists them).")
    row = describe(run)
    try:
        records = audit.read(run / rundir.AUDIT)
    except OSError as err:
        raise UsageError(f"Cannot read {run / rundir.AUDIT} ({err.strerror}).", "It is not readable by you.",
                         "Run sprite runs show as the run's owner.") from None
    stalls = hang.from_records(records)
    from sprite.cli import goodput as cli_goodput

    spent = cli_goodput.report([str(run)])  # where the device-hours went (issue 30)
    if json_out:
        return json.dumps({**row, "stalls": [r for r in records if r.get("kind") == "stall"], "goodput": spent},
                          indent=2)
    head = [f"{key}: {row[key]}" for key in ("run_dir", "status", "attempts", "resumes", "device_hours", "started")
            if key in row]
    return "\n".join([*head, *stalls, cli_goodput.text(spent, 1)])


def _table(rows: list[dict]) -> str:
    head = ("run", "status", "attempts", "resumes", "device-hours", "started")
    body = [(Path(r["run_dir"]).name, r["status"], str(r["attempts"] if r["attempts"] is not None else "-"),
             str(r["resumes"] if r["resumes"] is not None else "-"),
             f"{r['device_hours']:.4f}" if r["device_hours"] is not None else "-", r["started"][:19]) for r in rows]
    widths = [max(len(row[i]) for row in [head, *body]) for i in range(len(head))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in [head, *body])


def runs(args: Optional[List[str]] = typer.Argument(None, help="DIR to list, or: verify RUN, show RUN, goodput RUN..., plot RUN... FILE.png"),
         json_out: bool = typer.Option(False, "--json", help="print JSON")) -> int:
    args = list(args or [])
    if args[:1] == ["verify"]:
        if len(args) != 2:
            raise UsageError("sprite runs verify takes one run folder.", "", "Write: sprite runs verify RUN")
        reason = verify(Path(args[1]))
        typer.echo(json.dumps({"intact": True, "reason": reason}) if json_out else f"intact: {reason}")
        return 0
    if args[:1] in (["goodput"], ["plot"]):
        from sprite.cli import goodput

        typer.echo(goodput.main(args[1:], json_out) if args[0] == "goodput" else goodput.plot(args[1:]))
        return 0
    if args[:1] == ["show"]:
        if len(args) != 2:
            raise UsageError("sprite runs show takes one run folder.", "", "Write: sprite runs show RUN")
        typer.echo(show(Path(args[1]), json_out))
        return 0
    if len(args) > 1:
        raise UsageError("sprite runs takes at most one folder.", "",
                         "Write: sprite runs [DIR] or sprite runs verify RUN")
    rows = list_runs(Path(args[0] if args else rundir.DEFAULT_PARENT))
    typer.echo(json.dumps(rows, indent=2) if json_out else _table(rows) if rows else "no runs")
    return 0


def register(app: typer.Typer) -> None:
    app.command("runs", help=HELP)(runs)
