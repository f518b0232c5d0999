"""`sprite ckpt-check`: does a resumed run continue the run it resumes? Mount ``app`` as `sprite ckpt-check` (the
shape of parity/command.py: its options run the check, `run` is the same command, `compare` sits beside it).

Imports nothing heavy at module import (no torch, lightning or transformers): `sprite --help` stays instant.
Exit codes: 0 pass, 1 fail (a required check failed, a fault was not rejected, a role was not executed, a
result or checkpoint was altered), 2 bad usage.
"""

from __future__ import annotations

import os
import pathlib
import signal
import sys
from typing import Optional

import typer

from sprite.errors import EXIT_OK, SpriteError, UsageError
from sprite.parity.command import fail, harness
from sprite.parity.outdir import default_out, out_help

def _finish(report: dict) -> None:
    from sprite.parity.ckpt.report import show

    show(report)
    raise typer.Exit(EXIT_OK if report["verdict"] == "pass" else 1)


def settings_from(precision: str, devices: int, nodes: int, model: str, accelerator: str, time_limit: int,
                  slots: int = 2):
    """The check's settings. Raises UsageError for any option the check cannot run with."""
    from sprite.parity.ckpt.settings import CkptSettings
    from sprite.parity.usage import check_common

    model = check_common("ckpt-check", precision, accelerator, model,
                         "The check runs the recipe in FP32 or under BF16 autocast.")
    from sprite.parity.usage import at_most
    from sprite.values.grammar import MAX_RANKS_PER_NODE

    at_most(("--devices", devices, MAX_RANKS_PER_NODE), ("--nodes", nodes, 100_000),
            ("--time-limit", time_limit, 30 * 86400), ("--slots", slots, 4096))  # before the even-count check
    world = devices * nodes
    if devices < 1 or nodes < 1 or world < 2 or (devices % 2 and nodes % 2):
        raise UsageError(f"--devices {devices} --nodes {nodes} gives {world} rank(s).",
                         "The check resumes the sharded checkpoint at half the world size, so it needs an even"
                         " number of devices or of nodes, and at least 2 ranks.", "Pass --devices 2 (or 4, ...).")
    if time_limit < 1:
        raise UsageError(f"--time-limit {time_limit} is not a positive number of seconds.", "",
                         "Pass the seconds one launch may take, e.g. --time-limit 1800.")
    if slots < 2:
        raise UsageError(f"--slots {slots} is fewer than 2.", "A distributed launch takes two slots.",
                         "Pass --slots 2 (the default) or more.")
    return CkptSettings(precision=precision, devices=devices, nodes=nodes, model=model, accelerator=accelerator,
                        time_limit=time_limit, slots=slots)


def _interruptible(run, *args):
    """``run(*args)``, with SIGTERM treated as Ctrl-C: either stops the running launches (and everything they
    started) before the check exits with 130."""
    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        return run(*args)
    except KeyboardInterrupt:
        print("sprite: ckpt-check interrupted; the running launches were stopped.", file=sys.stderr, flush=True)
        raise typer.Exit(130) from None
    finally:
        signal.signal(signal.SIGTERM, previous)


def ckpt_check(
    devices: int = typer.Option(2, help="Ranks per node for the ddp and fsdp arms."),
    nodes: int = typer.Option(1, help="Nodes for the ddp and fsdp arms."),
    out: Optional[pathlib.Path] = typer.Option(None, help=out_help("A new directory for results, checkpoints and the"
                                                                   " report.", "ckpt-check")),
    precision: str = typer.Option("32-true", help="32-true or bf16-mixed."),
    model: str = typer.Option("tiny", help="tiny, qwen2.5-0.5b-shape, or a local checkpoint directory."),
    accelerator: str = typer.Option("auto", help="auto, cpu, cuda or xpu."),
    time_limit: int = typer.Option(1800, help="Seconds one launch may run; a launch still running then ends the"
                                              " check as not executed."),
    slots: int = typer.Option(2, help="Launch slots: a one-process launch takes one, a distributed launch two;"
                                      " more runs independent launches side by side (e.g. 6 on a GPU host)."),
    fresh_processes: bool = typer.Option(False, "--fresh-processes",
                                         help="Launch every role in processes of its own (slower: a start-up each)"
                                              " instead of warm pools that run role after role; the killed roles"
                                              " always get their own."),
) -> None:
    """Run every role (in warm pools of processes, the killed fits in their own), then compare.

    Example: sprite ckpt-check run --devices 2 --out ckpt-check-out"""
    try:
        settings = settings_from(precision, devices, nodes, model, accelerator, time_limit, slots)
        out = out if out is not None else default_out("ckpt-check")
        from rich.console import Console

        from sprite.parity.ckpt.compare import compare
        from sprite.parity.ckpt.report import REPORT, write
        from sprite.parity.ckpt.runner import claim_dir, run_launches

        claim_dir(out, settings)
        Console().print(f"results: {out}", markup=False, highlight=False, soft_wrap=True)
        timing = _interruptible(run_launches, out, settings, Console(), fresh_processes)
        Console().print(f"every launch ended in {timing['wall_s']:.1f} s; comparing")
        report = {**compare(out), "wall_s": timing["wall_s"]}
        write(out / REPORT, report)
    except SpriteError as err:
        fail(err)
    _finish(report)


app = harness("ckpt-check", ckpt_check,
              "Kill a fit after its epoch-1 checkpoint, resume and reload it, for 1 device, DDP and FSDP2 (sharded and"
              " full-state checkpoints), with a reshard at half the world size, an export to 1 device and 12 injected"
              " faults; the restored state must equal the saved state bit for bit.",
              ["sprite ckpt-check",
               "sprite ckpt-check --devices 2 --out runs/ckpt",
               "sprite ckpt-check --devices 4 --precision bf16-mixed --model qwen2.5-0.5b-shape --out runs/ckpt-bf16",
               "sprite ckpt-check compare runs/ckpt"])


@app.command("compare")
def compare_command(
    directory: pathlib.Path = typer.Argument(..., help="The --out directory of a checkpoint check (or a copy)."),
    report_path: Optional[pathlib.Path] = typer.Option(None, "--report",
                                                       help="Also write the report to this new file."),
) -> None:
    """Recompute the verdict from the sealed results and checkpoints in DIR; an altered one fails it.

    Example: sprite ckpt-check compare ckpt-check-out --report again.json"""
    try:
        from sprite.parity.ckpt.compare import compare
        from sprite.parity.ckpt.report import write

        if report_path is not None and os.path.lexists(report_path):
            raise UsageError(f"--report {report_path} exists already.", "Reports are never written over.",
                             "Pass a new file name.")
        report = compare(directory)
        if report_path is not None:
            write(report_path, report)
    except SpriteError as err:
        fail(err)
    _finish(report)
