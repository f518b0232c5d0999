"""Reports: NaN-free JSON files for machines; for people the verdict and a summary first (counts and failing
checks), the tables of every check, value and bound behind ``--details``."""

from __future__ import annotations

import json
import os
import pathlib

from rich.console import Console
from rich.table import Table

from sprite import integrity
from sprite.parity.store import clean


def write_json(path: pathlib.Path, report: dict) -> None:
    """Writes ``report`` as strict JSON (non-finite numbers become null), replacing any earlier report; the file
    is created 0600 under a temporary name first. Raises IntegrityError if that temporary name exists."""
    text = json.dumps(clean(report), indent=1, sort_keys=True, allow_nan=False)
    tmp = path.with_suffix(".json.tmp")
    integrity.write_new(tmp, text.encode())
    os.replace(tmp, path)


def _value(value) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    if value is None:
        return "non-finite"
    return str(value)


def _table(title: str, checks: list[dict]) -> Table:
    table = Table(title=title, title_justify="left")
    for column in ("check", "value", "bound", "result"):
        table.add_column(column)
    for c in checks:
        result = "[green]pass[/green]" if c["passed"] else "[red]FAIL[/red]"
        table.add_row(c["name"], _value(c["value"]), _value(c["bound"]), result)
    return table


def _fault_table(report: dict) -> Table:
    table = Table(title="Negative controls", title_justify="left")
    for column in ("fault", "arm", "status", "reason"):
        table.add_column(column)
    for case in report["cases"]:
        colour = "green" if case["status"] == "rejected" else "red"
        table.add_row(case["fault"], case["arm"], f"[{colour}]{case['status']}[/{colour}]", case["reason"])
    return table


def _failed(report: dict) -> list[dict]:
    parts = ("checks", "invariants", "gate", "scored")
    return [c for part in parts for c in report.get(part, []) if not c["passed"]]


def summary_lines(name: str, report: dict) -> list[str]:
    """One line per report (counts), then one per failing check or fault case: what a person reads first."""
    if "cases" in report:
        rejected = sum(case["status"] == "rejected" for case in report["cases"])
        lines = [f"{name}: {rejected} of {len(report['cases'])} negative controls rejected"]
        return lines + [f"  {c['fault']}/{c['arm']}: {c['status']} ({c['reason']})" for c in report["cases"]
                        if c["status"] != "rejected"]
    parts = [p for p in ("checks", "invariants", "gate", "scored") if p in report]
    counts = ", ".join(f"{p} {sum(c['passed'] for c in report[p])}/{len(report[p])}" for p in parts)
    lines = [f"{name}: {report['verdict']} ({counts} passed)"]
    return lines + [f"  FAIL {c['name']}: {_value(c['value'])} (bound {_value(c['bound'])})" for c in _failed(report)]


def show(reports: dict, verdict: str, console: Console | None = None, details: bool = False,
         extras: list[str] = ()) -> None:
    """Prints the verdict and a summary first; every check's table only with ``details``."""
    console = console or Console()
    colour = "green" if verdict == "pass" else "red"
    console.print(f"verdict: [bold {colour}]{verdict}[/bold {colour}]")
    for name, report in reports.items():
        for line in summary_lines(name, report):
            console.print(line, markup=False, highlight=False)
    for line in extras:
        console.print(line, markup=False, highlight=False)
    if not details:
        console.print("(--details shows every check with its value and bound)")
        return
    for name, report in reports.items():
        if "cases" in report:
            console.print(_fault_table(report))
        elif "checks" in report:
            console.print(_table(f"FP32 parity ({name})", report["checks"]))
        else:
            console.print(_table("Invariants (every arm, every step)", report["invariants"]))
            console.print(_table("Validity gate: split_premul vs split, step 0", report["gate"]))
            console.print(_table("Scored: ddp and fsdp vs split, step 0", report["scored"]))
