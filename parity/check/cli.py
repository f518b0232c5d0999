"""`sprite parity` and `sprite parity compare`: do DDP and FSDP2 compute what one device computes?

Mount ``app`` as `sprite parity` (the shape of parity/command.py: its options run the check, `run` is the same
command, `compare` sits beside it). Imports nothing heavy at module import (no torch, lightning or transformers):
`sprite --help` stays instant. Exit codes: 0 pass, 1 fail or void, 2 bad usage.
"""

from __future__ import annotations

import enum
import json
import pathlib
import time
from typing import List, Optional

import typer

from sprite.contract import ACCELERATORS
from sprite.errors import EXIT_OK, SpriteError, UsageError
from sprite.parity.command import fail, harness
from sprite.parity.outdir import default_out, out_help
from sprite.parity.check.faults import FAULTS
from sprite.parity.settings import PRECISIONS

# Fixed choices as str Enums, so --help lists them and typer refuses others (names from the light modules).
Precision = enum.Enum("Precision", {p: p for p in PRECISIONS}, type=str)
Accelerator = enum.Enum("Accelerator", {a: a for a in ACCELERATORS}, type=str)
Fault = enum.Enum("Fault", {f: f for f in FAULTS}, type=str)
DETAILS = typer.Option(False, "--details", help="also print every check with its value and bound")
JSON_OUT = typer.Option(False, "--json", help="print the reports as JSON on stdout (progress goes to stderr)")


def _finish(out: pathlib.Path | None, reports: dict, details: bool, json_out: bool, why: str = "") -> None:
    from rich.console import Console

    from sprite.parity.check import plot
    from sprite.parity.check.compare import overall
    from sprite.parity.check.report import show

    verdict = overall(reports)
    png = plot.write_png(out, reports) if out is not None else None
    if json_out:
        typer.echo(json.dumps({"verdict": verdict, "reports": reports, "plot": str(png) if png else None},
                              indent=1, sort_keys=True, allow_nan=False))
    else:
        if png or out is None:
            note = f"per-step gaps: {png}" if png else "per-step gaps: not drawn, no folder to draw them in"
        elif not plot.available():
            note = "per-step gaps: install the plot extra (pip install 'sprite-hpc[plot]') for a PNG beside the reports"
        else:
            note = "per-step gaps: none to draw (no arm recorded per-step values)"
        where = f"reports: {out}" if out is not None else f"reports: not written ({why})"
        show(reports, verdict, Console(), details, [where, note])
    raise typer.Exit(EXIT_OK if verdict == "pass" else 1)


def _settings(precision, devices, nodes, model, accelerator, fault, time_limit=1800):
    from sprite.parity.check import faults
    from sprite.parity.settings import Settings
    from sprite.parity.usage import check_common

    model = check_common("parity", precision, accelerator, model,
                         "Parity has a rule only for FP32 and for BF16 autocast (criterion v2).")
    if devices < 1 or nodes < 1 or devices * nodes < 2:
        raise UsageError(f"--devices {devices} --nodes {nodes} gives {devices * nodes} rank(s).",
                         "Parity compares a distributed run with one device, so it needs more than one rank.",
                         "Pass --devices 2 or more.")
    if time_limit < 1:
        raise UsageError(f"--time-limit {time_limit} is not a positive number of seconds.", "",
                         "Pass the seconds one arm may take, e.g. --time-limit 1800.")
    chosen = faults.validate(list(fault or []), precision, devices * nodes)
    return Settings(precision=precision, devices=devices, nodes=nodes, model=model, accelerator=accelerator,
                    faults=chosen, time_limit=time_limit)


def run_command(
    out: Optional[pathlib.Path] = typer.Option(None, help=out_help("A fresh directory for results and reports.",
                                                                   "parity")),
    precision: Precision = typer.Option(Precision("32-true"), help="FP32 rule, or BF16 autocast (criterion v2)."),
    devices: int = typer.Option(2, min=1, help="Ranks per node for the ddp and fsdp arms."),
    nodes: int = typer.Option(1, min=1, help="Nodes for the ddp and fsdp arms."),
    model: str = typer.Option("tiny", help="tiny, qwen2.5-0.5b-shape, or a local checkpoint directory."),
    fault: Optional[List[Fault]] = typer.Option(
        None, help="A negative control to run (repeatable; bf16-mixed only): " + ", ".join(FAULTS) + "."),
    accelerator: Accelerator = typer.Option(Accelerator("auto"),
                                            help="Device of every arm (auto: xpu, then cuda, then cpu)."),
    time_limit: int = typer.Option(1800, min=1, help="Seconds one arm may run; an arm still running then ends "
                                                      "the check as not executed."),
    fresh_processes: bool = typer.Option(False, "--fresh-processes",
                                         help="Launch every arm in processes of its own (slower: each pays the "
                                              "start-up) instead of one warm pool that runs arm after arm."),
    details: bool = DETAILS,
    json_out: bool = JSON_OUT,
) -> None:
    """Run every arm in warm pools of processes (or each in its own), showing their progress; then compare and
    print the verdict.

    Example: sprite parity run --precision bf16-mixed --out parity-bf16"""
    try:
        settings = _settings(precision.value, devices, nodes, model, accelerator.value, [f.value for f in fault or []],
                             time_limit)
        out = out if out is not None else default_out("parity")
        from rich.console import Console

        from sprite.parity.check.compare import compare
        from sprite.parity.check.runner import claim_dir, run_arms

        claim_dir(out, settings)
        console = Console(stderr=json_out)
        console.print(f"results: {out}", markup=False, highlight=False, soft_wrap=True)
        start = time.monotonic()
        run_arms(out, settings, console, fresh=fresh_processes)
        console.print(f"all arms finished in {time.monotonic() - start:.1f} s; comparing")
        reports = compare(out)
    except SpriteError as err:
        fail(err)
    _finish(out, reports, details, json_out)


app = harness("parity", run_command,
              "Check that DDP and FSDP2 match a single device (FP32 rule, or BF16 criterion v2 with --precision "
              "bf16-mixed).", ["sprite parity --precision bf16-mixed",
                               "sprite parity --precision 32-true --devices 2 --out runs/fp32",
                               "sprite parity --precision bf16-mixed --devices 2 --out runs/bf16",
                               "sprite parity compare runs/fp32 --details"])


@app.command("compare")
def compare_command(directory: pathlib.Path = typer.Argument(..., help="The --out directory of a parity run."),
                    details: bool = DETAILS, json_out: bool = JSON_OUT):
    """Recompute the verdict from the saved results in DIR (a copy of DIR works too, read-only as well). The
    reports and the plot go to a new folder DIR/compare-N; the run's own are never written over (a folder that
    takes no new one gets its verdict, unwritten).

    Example: sprite parity compare parity-bf16 --details"""
    try:
        from sprite.parity.check.compare import compare

        reports = compare(directory, into=False)
    except SpriteError as err:
        fail(err)
    from sprite.parity.outdir import fresh_numbered

    into, why = fresh_numbered(directory, "compare")
    if into is not None:
        from sprite.parity.check.report import write_json

        for name, report in reports.items():
            write_json(into / name, report)
    _finish(into, reports, details, json_out, why)

