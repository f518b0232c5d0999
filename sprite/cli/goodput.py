"""``sprite runs goodput RUN... [--json]``: where the device-hours of a run (and of every run of its batch job)
went. Torch-free: reads ``audit.jsonl`` and the heartbeat files (``sprite.recovery.goodput``)."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

from sprite.errors import UsageError
from sprite.integrity.writeonce import write_new
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


COLOURS = {"productive": "tab:green", "lost_work": "tab:red", "restart": "tab:orange",
           "checkpoint_stall": "tab:blue", "stall_wait": "tab:purple", "other": "tab:gray"}


def spans(runs: list) -> list[tuple[str, int, float, float, str]]:
    """(row label, row, from, to, category) of every stretch of every attempt, times in seconds from the first
    attempt's start: the timeline the plot draws (checkpoint stalls drawn over the training they interrupt), and
    the marks "checkpoint" (each save) and "failure" (the end of an attempt that did not succeed)."""
    rows, origin = [], None
    for index, (records, beats) in enumerate(runs):
        for attempt in goodput.attempts(records):
            origin = attempt.started if origin is None else origin
            row, label = len({r[1] for r in rows}), f"run {index + 1} attempt {attempt.number}"
            head = "restart" if index > 0 or attempt.number > 1 or attempt.resumed else "other"
            stop = attempt.started + attempt.seconds
            times = goodput.marks(attempt, list(beats.get(attempt.number, [])))
            if attempt.cause != "success":
                rows.append((label, row, stop - origin, stop - origin, "failure"))
            if times is None:
                rows.append((label, row, attempt.started - origin, stop - origin, head))
                continue
            since = times["lost_from"] if times["lost_from"] is not None else times["last"]
            tail = "stall_wait" if attempt.cause == "stall" else "other"
            for begin, end, category in ((attempt.started, times["first"], head),
                                         (times["first"], since, "productive"), (since, times["last"], "lost_work"),
                                         (times["last"], stop, tail)):
                if end > begin:
                    rows.append((label, row, begin - origin, end - origin, category))
            for save in times["saves"]:
                rows.append((label, row, save.resumed_at - save.stall - origin, save.resumed_at - origin,
                             "checkpoint_stall"))
                rows.append((label, row, save.resumed_at - origin, save.resumed_at - origin, "checkpoint"))
    return rows


def plot(args: list[str]) -> str:
    """``sprite runs plot RUN... FILE.png``: the timeline of the runs' attempts, coloured by category, to a new
    PNG (never over an existing file). Raises UsageError (no matplotlib, a FILE that exists or is no .png)."""
    if len(args) < 2 or not args[-1].endswith(".png"):
        raise UsageError("sprite runs plot takes run folders and a new .png file.", "",
                         "Write: sprite runs plot RUN timeline.png")
    target = Path(args[-1])
    if os.path.lexists(target):
        raise UsageError(f"{target} exists already.", "sprite never overwrites a file.", "Name a new .png file.")
    try:
        import matplotlib
    except ImportError:
        raise UsageError("The plot needs matplotlib.", "It is an optional extra.",
                         "pip install 'sprite[plot]' (or matplotlib).") from None
    runs = [goodput.load(path) for path in folders(args[:-1])]
    runs.sort(key=lambda run: str(run[0][0].get("time", "")) if run[0] else "")
    result = goodput.account(runs)
    matplotlib.use("Agg")
    from matplotlib import pyplot
    from matplotlib.patches import Patch

    stretches = spans(runs)
    labels = {row: label for label, row, *_ in stretches}
    figure, axes = pyplot.subplots(figsize=(10, 1.2 + 0.5 * max(len(labels), 1)))
    for _, row, begin, end, category in stretches:
        if category in ("checkpoint", "failure"):
            axes.plot([begin], [row], marker="|" if category == "checkpoint" else "x", color="black",
                      markersize=14 if category == "checkpoint" else 10, linestyle="none")
            continue
        height = 0.3 if category == "checkpoint_stall" else 0.6
        axes.barh(row, end - begin, left=begin, height=height, color=COLOURS[category])
    axes.set_yticks(list(labels), [labels[row] for row in labels])
    axes.invert_yaxis()
    axes.set_xlabel("seconds from the first attempt's start")
    hours = result["device_hours"]
    from matplotlib.lines import Line2D

    marks = [Line2D([], [], marker="|", color="black", linestyle="none", label="checkpoint"),
             Line2D([], [], marker="x", color="black", linestyle="none", label="failure / preemption")]
    axes.legend(handles=[*[Patch(color=COLOURS[c], label=f"{c} {hours[c]:.4g} device-h")
                           for c in goodput.CATEGORIES], *marks],
                loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=3, fontsize="small")
    axes.set_title(f"device-hours {hours['total']:.4g}, goodput {100 * result['goodput']:.1f}%")
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", bbox_inches="tight")
    pyplot.close(figure)
    write_new(target, buffer.getvalue(), 0o644)
    return f"wrote {target}"
