"""The report of `sprite preflight`: JSON for machines (``preflight.json`` in the output folder, or ``--json`` on
stdout) and a table per node for a person. The exit code is the verdict: 0 every node healthy, 1 some node failed
or the preflight was inconclusive (its launch failed as a whole: ``inconclusive`` says how, and names no node).
"""

from __future__ import annotations

import json
import pathlib

from rich.console import Console
from rich.table import Table
from rich.text import Text

from sprite.integrity import write_new
from sprite.parity.preflight.settings import PreflightSettings

REPORT = "preflight.json"


def build(out: pathlib.Path, settings: PreflightSettings, launch_plan, launched, nodes: list[dict],
          computed: dict, final: dict, inconclusive: str | None = None) -> dict:
    """``inconclusive``: why the launch as a whole names no node (then no node is ok), or None."""
    world = launch_plan.world
    global_times = [r["global_allreduce"]["seconds"] for r in final.values()
                    if r.get("global_allreduce", {}).get("ok")]
    return {
        "ok": inconclusive is None and all(node["ok"] for node in nodes),
        "failed_hosts": [node["host"] for node in nodes if node["failed"]],
        "inconclusive": inconclusive,
        "nodes": nodes,
        "world": {"nodes": world.nodes, "ranks_per_node": world.devices, "launcher": world.flavour,
                  "scheduler": world.alloc.scheduler, "job_id": world.alloc.job_id},
        "launch": {"seconds": round(launched.seconds, 3), "exit_code": launched.exit_code,
                   "stopped": launched.stopped, "log": str(out / "launch.log"), "rank_logs": str(out / "logs")},
        "global_allreduce_seconds": max(global_times) if global_times else None,
        "settings": json.loads(settings.to_json()),
        "ranks": {str(rank): {"host": record.get("host"), "device_name": record.get("device_name"),
                              "torch": record.get("torch"), "seconds": record.get("seconds"),
                              "digests": record.get("digests")} for rank, record in sorted(computed.items())},
        "out": str(out),
    }


def save(report: dict, out: pathlib.Path) -> pathlib.Path:
    path = out / REPORT
    write_new(path, json.dumps(report, indent=1, sort_keys=True).encode())
    return path


def _number(value, unit: str, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}{unit}"


def describe(node: dict) -> str:
    """A node's state in a few words: ok, each failed check with its first reason, or not judged."""
    if node["ok"]:
        return "ok"
    if not node["failed"]:
        return "not judged (the preflight is inconclusive)"
    return "; ".join(f"{check}: {reasons[0]}" + (f" (+{len(reasons) - 1})" if len(reasons) > 1 else "")
                     for check, reasons in node["failed"].items())


def show(report: dict, console: Console) -> None:
    table = Table(title="sprite preflight", title_justify="left")
    for column in ("node", "host", "state", "compute", "node bus bw", "all bus bw"):
        table.add_column(column)
    for node in report["nodes"]:
        state = describe(node)
        style = "green" if node["ok"] else "red" if node["failed"] else "yellow"
        shown = Text(state, style=style)  # Text: reasons hold brackets, never markup
        table.add_row(str(node["node"]), Text(node["host"]), shown,
                      _number(node["compute_seconds"], " s"), _number(node["node_busbw_gbps"], " GB/s"),
                      _number(node["global_busbw_gbps"], " GB/s"))
    console.print(table)
    launch = report["launch"]
    how = f", stopped by sprite ({launch['stopped']})" if launch["stopped"] else ""
    verdicts = [f"failed: {', '.join(report['failed_hosts'])}" if report["failed_hosts"] else "",
                f"inconclusive: {report['inconclusive']}" if report.get("inconclusive") else ""]
    verdict = "all nodes healthy" if report["ok"] else "; ".join(v for v in verdicts if v)
    console.print(f"{len(report['nodes'])} node(s) in {launch['seconds']:.1f} s{how}: {verdict}", markup=False,
                  highlight=False)
