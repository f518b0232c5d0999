"""`sprite parity`: do DDP and FSDP2 compute what one device computes? Mount ``app`` as `sprite parity`.

Imports nothing heavy at module import (no torch, lightning or transformers): `sprite --help` stays instant.
Exit codes: 0 pass, 1 fail or void, 2 bad usage.
"""

from __future__ import annotations

import pathlib
import sys
import time
from typing import List, Optional

import typer

from sprite.errors import EXIT_OK, SpriteError, UsageError, report

app = typer.Typer(
    name="parity", invoke_without_command=True, no_args_is_help=False, add_completion=False,
    help="Check that DDP and FSDP2 match a single device (FP32 rule, or BF16 criterion v2 with --precision bf16-mixed).",
)


def _finish(reports: dict) -> None:
    from sprite.parity.compare import overall
    from sprite.parity.report import show

    verdict = overall(reports)
    show(reports, verdict)
    raise typer.Exit(EXIT_OK if verdict == "pass" else 1)


def _fail(err: SpriteError) -> None:
    print(report(err), file=sys.stderr, flush=True)
    raise typer.Exit(err.exit_code)


def _settings(precision, devices, nodes, model, accelerator, fault, time_limit=1800):
    from sprite.parity import faults
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


@app.callback()
def parity(
    ctx: typer.Context,
    precision: str = typer.Option("32-true", help="32-true (FP32 rule) or bf16-mixed (criterion v2)."),
    devices: int = typer.Option(2, help="Ranks per node for the ddp and fsdp arms."),
    nodes: int = typer.Option(1, help="Nodes for the ddp and fsdp arms."),
    out: Optional[pathlib.Path] = typer.Option(None, help="A fresh directory for results and reports."),
    model: str = typer.Option("tiny", help="tiny, qwen2.5-0.5b-shape, or a local checkpoint directory."),
    fault: Optional[List[str]] = typer.Option(None, help="A negative control to run (repeatable)."),
    accelerator: str = typer.Option("auto", help="auto, cpu, cuda or xpu."),
    time_limit: int = typer.Option(1800, help="Seconds one arm may run; an arm still running then ends the check"
                                              " as not executed."),
) -> None:
    """Run every arm, each in its own processes, then compare."""
    if ctx.invoked_subcommand is not None:
        return
    try:
        if out is None:
            raise UsageError("No --out directory given.", "Every run needs a fresh place for its results.",
                             "Pass --out DIR (a directory that does not exist yet or is empty).")
        settings = _settings(precision, devices, nodes, model, accelerator, fault, time_limit)
        from rich.console import Console

        from sprite.parity.compare import compare
        from sprite.parity.runner import claim_dir, run_arms

        claim_dir(out, settings)
        start = time.monotonic()
        run_arms(out, settings, Console())
        Console().print(f"all arms finished in {time.monotonic() - start:.1f} s; comparing")
        reports = compare(out)
    except SpriteError as err:
        _fail(err)
    _finish(reports)


@app.command("compare")
def compare_command(directory: pathlib.Path = typer.Argument(..., help="The --out directory of a parity run.")):
    """Recompute the verdict from the saved results in DIR (a copy of DIR works too)."""
    try:
        from sprite.parity.compare import compare

        reports = compare(directory)
    except SpriteError as err:
        _fail(err)
    _finish(reports)
