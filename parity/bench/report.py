"""The benchmark report: ``bench.json`` for machines, a rich table for people (verdict and summary first).

No torch: reads the ranks' records from the --out folder.
"""

from __future__ import annotations

import dataclasses
import functools
import pathlib
import platform

from rich import box
from rich.console import Console
from rich.table import Table

from sprite.parity.bench import stats as bench_stats
from sprite.parity.bench import store as bench_store
from sprite.parity.bench import summary as bench_summary
from sprite.parity.bench.settings import BenchSettings
from sprite.parity.store import ResultError

SCHEMA = "sprite-bench/1"


def _arm(out, settings, world, arm, results, failures) -> dict | None:
    runs = [r for r in results if r["world"] == world and r["arm"] == arm]
    for run in runs:
        if run["exit_code"] != 0:
            failures.append({"what": f"world {world} {arm} repeat {run['repeat'] + 1} exited {run['exit_code']}",
                             "log": run["log"]})
    launches, repeats = [], []
    for run in (r for r in runs if r["exit_code"] == 0):
        try:
            launches.append(bench_store.load_ranks(bench_store.arm_dir(out, world, arm, run["repeat"]), world))
            repeats.append(run["repeat"])
        except ResultError as err:
            failures.append({"what": f"world {world} {arm} repeat {run['repeat'] + 1}: {err}", "log": run["log"]})
    return bench_stats.arm_figures(launches, settings, world, repeats) if launches else None


def build(out: pathlib.Path, settings: BenchSettings, results: list[dict]) -> dict:
    """The whole report from the launches' results and the records they wrote."""
    failures, points = [], []
    for world in settings.sweep:
        nodes, devices = settings.placement(world)
        arms = {arm: fig for arm in settings.arms
                if (fig := _arm(out, settings, world, arm, results, failures)) is not None}
        ratios = {base: bench_stats.ratio(arms["sprite"], arms[base])
                  for base in settings.baselines if "sprite" in arms and base in arms}
        points.append({"world": world, "nodes": nodes, "devices": devices, "arms": arms, "ratios": ratios})
    efficiency = bench_stats.efficiency(points)
    for point in points:
        point["efficiency"] = efficiency.get(point["world"])
    report = {"schema": SCHEMA, "settings": dataclasses.asdict(settings), "method": bench_summary.method(settings),
              "environment": {"host": platform.node(), "python": platform.python_version()},
              "launches": results, "failures": failures, "points": points}
    report["summary"] = bench_summary.lines(report, settings)
    return report


def _cell(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _gib(memory: dict | None) -> str:
    if not memory:
        return "n/a"
    return f"{memory['allocated'] / 2**30:.2f} / {memory['reserved'] / 2**30:.2f}"


def _table(title: str, columns: tuple[str, ...]) -> Table:
    table = Table(title=title, title_justify="left", box=box.SIMPLE, show_edge=False, pad_edge=False)
    for column in columns:
        table.add_column(column)
    return table


def _tables(report: dict) -> tuple[Table, Table]:
    steps = _table("Step time and throughput", ("world", "arm", "step ms (min-max)", "tokens/s", "tok/s/device",
                                                 "vs raw", "vs lightning"))
    usage = _table("Compute, memory, data loading, communication", ("world", "arm", "TFLOP/s/dev", "MFU",
                                                                     "GiB alloc/res", "data", "comm ms", "efficiency"))
    for point in report["points"]:
        for arm, f in point["arms"].items():
            step = f["step_s"]
            ratios = [point["ratios"].get(b) if arm == "sprite" else None for b in ("raw", "lightning")]
            steps.add_row(str(point["world"]), arm,
                          f"{step['median'] * 1e3:.4g} ({step['min'] * 1e3:.3g}-{step['max'] * 1e3:.3g})",
                          f"{f['tokens_per_s']:.4g}", f"{f['tokens_per_s_per_device']:.4g}",
                          *[_cell(r["median"] if r else None, ".3f") for r in ratios])
            comm = f["comm_s"] * 1e3 if f["comm_s"] is not None else None
            usage.add_row(str(point["world"]), arm, _cell(f["tflops_per_device"], ".3g"), _cell(f["mfu"], ".1%"),
                          _gib(f["memory"]), _cell(f["data_share"], ".1%"), _cell(comm, ".3g"),
                          _cell(point["efficiency"], ".0%") if arm == "sprite" else "")
    return steps, usage


def show(report: dict, console: Console | None = None) -> None:
    """Prints the verdict and summary, the table, how it was measured, and where the plot went."""
    console = console or Console()
    say = functools.partial(console.print, markup=False, highlight=False, soft_wrap=True)  # one line each
    for line in report["summary"]:
        say(line)
    for table in _tables(report):
        console.print(table)
    for name, text in report["method"].items():
        say(f"{name}: {text}")
    plot = report.get("plot", {})
    say(f"plot: {plot['file']}" if "file" in plot else f"plot skipped: {plot.get('skipped')}")
