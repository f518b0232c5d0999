"""The checkpoint check's report: ``checkpoint_report.json`` (written once) and rich tables, the verdict first."""

from __future__ import annotations

import json
import pathlib
from collections import defaultdict

from rich.console import Console
from rich.table import Table

from sprite import integrity
from sprite.parity.ckpt.gaps import KINDS
from sprite.parity.store import clean

REPORT = "checkpoint_report.json"


def write(path: pathlib.Path, report: dict) -> None:
    """Writes ``report`` as strict JSON into a new file. Raises IntegrityError if ``path`` exists."""
    integrity.write_new(path, json.dumps(clean(report), indent=1, sort_keys=True, allow_nan=False).encode())


def summary(report: dict) -> str:
    """One line: the verdict and what it rests on."""
    checks, cases = report["checks"], report["faults"]
    passed = sum(c["passed"] for c in checks)
    rejected = sum(case["status"] == "rejected" for case in cases)
    missing = sum(case["status"] == "not executed" for case in cases)
    s = report["settings"]
    world = s["devices"] * s["nodes"]
    text = (f"{report['verdict'].upper()}: {passed}/{len(checks)} required checks passed, {rejected}/{len(cases)} "
            f"faults rejected ({missing} not executed); {s['precision']}, {s['model']}, {world} ranks")
    return text


def _number(value) -> str:
    if value is None:
        return "non-finite"
    return "0" if value == 0 else f"{value:.3g}"


def _arms_table(report: dict) -> Table:
    table = Table(title="Required, bit for bit (every rank)", title_justify="left")
    table.add_column("arm")
    table.add_column("passed")
    table.add_column("failed checks", overflow="fold")
    by_arm = defaultdict(list)
    for c in report["checks"]:
        by_arm[c["arm"]].append(c)
    for arm, checks in by_arm.items():
        failed = [f"{c['name']}: {str(c['value'])[:160]}" for c in checks if not c["passed"]]
        colour = "red" if failed else "green"
        table.add_row(arm, f"[{colour}]{len(checks) - len(failed)}/{len(checks)}[/{colour}]", "\n".join(failed))
    return table


def _faults_table(report: dict) -> Table:
    table = Table(title="Negative controls (injected after the restore)", title_justify="left")
    for column in ("fault", "arm", "status"):
        table.add_column(column)
    table.add_column("reason", overflow="fold")
    for case in report["faults"]:
        colour = "green" if case["status"] == "rejected" else "red"
        table.add_row(case["fault"], case["arm"], f"[{colour}]{case['status']}[/{colour}]", case["reason"])
    return table


def _gaps_table(report: dict) -> Table:
    table = Table(title="Reported, not scored: largest relative gaps over the resumed steps", title_justify="left")
    for column in ("arm", "against", "loss", "pre-clip norm", "update", "Adam m", "Adam v"):
        table.add_column(column)
    for row in report["gaps"]:
        table.add_row(row["arm"], row["against"], *(_number(row.get(kind)) for kind in KINDS))
    return table


def show(report: dict, console: Console | None = None) -> None:
    """Prints the verdict line, then the required checks per arm, the fault cases and the reported gaps."""
    console = console or Console()
    colour = "green" if report["verdict"] == "pass" else "red"
    console.print(f"verdict: [bold {colour}]{summary(report)}[/bold {colour}]")
    console.print(_arms_table(report))
    console.print(_faults_table(report))
    console.print(_gaps_table(report))
