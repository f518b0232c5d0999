"""`sprite parity`: do DDP and FSDP2 compute what one device computes? Mount ``app`` as `sprite parity`.

Imports nothing heavy at module import (no torch, lightning or transformers): `sprite --help` stays instant.
Exit codes: 0 pass, 1 fail or void, 2 bad usage.
"""

from __future__ import annotations

import importlib.util
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


def _settings(precision, devices, nodes, model, accelerator, fault):
    from sprite.parity import faults
    from sprite.parity.settings import PRECISIONS, PRESETS, Settings
    from sprite.contract import ACCELERATORS

    if precision not in PRECISIONS:
        raise UsageError(f"--precision {precision!r} is not supported.",
                         "Parity has a rule only for FP32 and for BF16 autocast (criterion v2).",
                         f"Use one of: {', '.join(PRECISIONS)}.")
    if accelerator not in ACCELERATORS:
        raise UsageError(f"--accelerator {accelerator!r} is not supported.",
                         "The arms run only on the device types in sprite's device table.",
                         f"Use one of: {', '.join(ACCELERATORS)}.")
    if devices < 1 or nodes < 1 or devices * nodes < 2:
        raise UsageError(f"--devices {devices} --nodes {nodes} gives {devices * nodes} rank(s).",
                         "Parity compares a distributed run with one device, so it needs more than one rank.",
                         "Pass --devices 2 or more.")
    missing = [name for name in ("peft", "transformers") if importlib.util.find_spec(name) is None]
    if missing:
        raise UsageError(f"sprite parity needs {' and '.join(missing)}, which {'is' if len(missing) == 1 else 'are'}"
                         " not installed here.", "They are an optional extra of sprite (the LoRA recipe).",
                         "pip install 'sprite-hpc[parity]' (or peft and transformers), then run again.")
    if model not in PRESETS and not (pathlib.Path(model) / "config.json").is_file():
        raise UsageError(f"--model {model!r} is neither a preset nor a checkpoint directory.",
                         "Hub ids are not fetched (the hub is never contacted).",
                         f"Pass {', '.join(PRESETS)} or a local directory holding config.json.")
    model = model if model in PRESETS else str(pathlib.Path(model).resolve())
    chosen = faults.validate(list(fault or []), precision, devices * nodes)
    return Settings(precision=precision, devices=devices, nodes=nodes, model=model, accelerator=accelerator,
                    faults=chosen)


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
) -> None:
    """Run every arm, each in its own processes, then compare."""
    if ctx.invoked_subcommand is not None:
        return
    try:
        if out is None:
            raise UsageError("No --out directory given.", "Every run needs a fresh place for its results.",
                             "Pass --out DIR (a directory that does not exist yet or is empty).")
        settings = _settings(precision, devices, nodes, model, accelerator, fault)
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
