"""A PNG of the per-step gaps of a parity run, beside its reports (``gaps.png``), when matplotlib is installed
(the ``plot`` extra: ``pip install 'sprite-hpc[plot]'``). Plotting is never needed for the verdict.

FP32: the largest relative pre-clip gradient-norm gap of ddp and fsdp against ref, per step. BF16: the largest
normalised per-tensor gradient gap of each diagnostic pair, per step. A gap of exactly 0 (bitwise equal) is
drawn at ``FLOOR`` on the log axis.
"""

from __future__ import annotations

import importlib.util
import math
import os
import pathlib
import tempfile

NAME = "gaps.png"
FLOOR = 1e-16


def series(reports: dict) -> dict[str, list[float]]:
    """Per-step gaps by pair, from the reports `compare` wrote (non-finite gaps left out)."""
    out: dict[str, list[float]] = {}
    for report in reports.values():
        for pair, steps in report.get("per_step", {}).items():
            out[pair] = steps
        for pair, steps in report.get("diagnostics", {}).get("per_step", {}).items():
            out[pair] = [step["max_gap"] for step in steps]
    return {pair: [g if g is not None and math.isfinite(g) else math.nan for g in gaps] for pair, gaps in out.items()}


def available() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


def write_png(out: pathlib.Path, reports: dict) -> pathlib.Path | None:
    """Writes ``out/gaps.png`` and returns its path; None when matplotlib is missing or there is nothing to plot."""
    lines = series(reports)
    if not lines or not available():
        return None
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    from matplotlib import pyplot

    figure, axes = pyplot.subplots(figsize=(6.4, 4.0))
    for pair, gaps in lines.items():
        axes.plot(range(len(gaps)), [max(g, FLOOR) if g == g else math.nan for g in gaps], marker="o", label=pair)
    axes.set_yscale("log")
    axes.set_xlabel("step")
    axes.set_ylabel("largest relative gap (0 drawn at 1e-16)")
    axes.set_title("sprite parity: per-step gaps")
    axes.legend(fontsize="small")
    handle, temp = tempfile.mkstemp(prefix=".gaps-", suffix=".png", dir=out)  # a new file, never a link
    with os.fdopen(handle, "wb") as stream:
        figure.savefig(stream, format="png", dpi=100, bbox_inches="tight")
    pyplot.close(figure)
    os.replace(temp, out / NAME)  # like the JSON reports: the newest comparison's picture
    return out / NAME
