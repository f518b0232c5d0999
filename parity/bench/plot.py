"""The sweep as a PNG: step time per world size for every arm (ideal: flat, the per-rank batch is fixed) and
sprite's scaling efficiency against the ideal 100%. Needs matplotlib (the ``plot`` extra); without it the plot is
skipped and the report says so.
"""

from __future__ import annotations

import importlib.util
import io
import pathlib

from sprite.integrity.writeonce import write_new

PLOT_FILE = "bench.png"


def prepare() -> None:
    """Import matplotlib's pyplot and draw one throwaway plot of the same kind now, so that the plot at the end
    finds fonts, the Agg renderer and the PNG writer loaded (measured on 2 CPU cores, 2026-12-03: 0.8 s here,
    and the plot at the end 0.2 s instead of 0.36 s): `sprite bench` calls this while its warm server imports
    torch on the other core. Without matplotlib, nothing."""
    if importlib.util.find_spec("matplotlib") is not None:
        sprite = {"step_s": {"median": 1.0}}
        points = [{"world": world, "efficiency": 1.0 / world, "arms": {"sprite": sprite}} for world in (1, 2)]
        _figure({"points": points})


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # no display on a compute node
    from matplotlib import pyplot

    return pyplot


def _figure(report: dict) -> bytes:
    pyplot = _pyplot()

    points = [p for p in report["points"] if p["arms"]]
    worlds = [p["world"] for p in points]
    figure, (steps, scaling) = pyplot.subplots(1, 2, figsize=(10, 4))
    for arm in sorted({arm for p in points for arm in p["arms"]}):
        have = [p for p in points if arm in p["arms"]]
        steps.plot([p["world"] for p in have], [p["arms"][arm]["step_s"]["median"] * 1e3 for p in have],
                   marker="o", label=arm)
    base = [p for p in points if "sprite" in p["arms"]]
    if base:
        steps.axhline(base[0]["arms"]["sprite"]["step_s"]["median"] * 1e3, linestyle="--", color="grey",
                      label="ideal (sprite)")
    steps.set(xlabel="world size (ranks)", ylabel="step time (ms)", title="Step time", xticks=worlds)
    steps.legend()
    scaling.plot([p["world"] for p in base], [p["efficiency"] * 100 for p in base], marker="o", label="sprite")
    scaling.axhline(100, linestyle="--", color="grey", label="ideal")
    top = max([110] + [p["efficiency"] * 110 for p in base])
    scaling.set(xlabel="world size (ranks)", ylabel="efficiency (%)", title="Scaling efficiency", xticks=worlds,
                ylim=(0, top))
    scaling.legend()
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    pyplot.close(figure)
    return buffer.getvalue()


def write(out: pathlib.Path, report: dict) -> dict:
    """Writes ``out/bench.png`` once (0600); returns {"file": name} or {"skipped": reason}. Raises
    IntegrityError if it exists."""
    if importlib.util.find_spec("matplotlib") is None:
        return {"skipped": "matplotlib is not installed (pip install 'sprite-hpc[plot]')"}
    if not any(p["arms"] for p in report["points"]):
        return {"skipped": "no arm produced a result"}
    write_new(out / PLOT_FILE, _figure(report))
    return {"file": PLOT_FILE}
