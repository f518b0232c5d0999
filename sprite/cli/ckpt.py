"""``sprite ckpt verify PATH`` and ``sprite ckpt list DIR``: check checkpoints against their sprite manifests;
``sprite ckpt consolidate CKPT_DIR OUT``: an FSDP2 sharded checkpoint -> one file a 1-device fit resumes from.

No torch or lightning at import: a login node verifies a checkpoint with the standard library alone (consolidate
imports torch inside the command). Exit codes: 0 valid (or written), 1 invalid (the reason on one line), 2 bad
usage.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import typer

from sprite.errors import EXIT_CHECK_FAILED, UsageError, report, size_text

app = typer.Typer(name="ckpt", no_args_is_help=True, add_completion=False, rich_markup_mode=None,
                  help="Verify checkpoints against the manifests sprite writes when it saves them.\n\n"
                       "Example: sprite ckpt list checkpoints/")


def _exists(path: str, what: str) -> Path:
    if not path:
        raise UsageError(f"sprite ckpt {what} was given an empty path.", "", "Pass a checkpoint file or folder.")
    if not os.path.lexists(path):
        raise UsageError(f"{path} does not exist.", f"sprite ckpt {what} needs an existing path.",
                         "Check the path (a checkpoint file or folder, or the folder holding them).")
    return Path(path)


@app.command("verify", help="Check every file of a checkpoint (a file or a folder) against its manifest: sizes"
                            " and SHA-256. Exit 0 valid, 1 invalid (the reason is printed), 2 bad usage.\n\n"
                            "Example: sprite ckpt verify checkpoints/last.ckpt")
def verify(path: str = typer.Argument(..., help="checkpoint file or folder")) -> None:
    from sprite.integrity import scan as ckpt_scan

    entry = ckpt_scan.inspect(_exists(path, "verify"), verify=True)
    if not entry.valid:
        from sprite.integrity import IntegrityError

        unsealed = "has no manifest" in entry.reason
        cause = ("It was not saved under sprite, or its save was cut short." if unsealed else
                 "It was cut short or changed after the save.")
        print(report(IntegrityError(f"invalid checkpoint: {entry.reason.rstrip('.')}.", cause,
                                    "Use another checkpoint.")), file=sys.stderr, flush=True)
        raise typer.Exit(EXIT_CHECK_FAILED)
    typer.echo(f"valid: {path} (step {entry.step}, epoch {entry.epoch}, {size_text(entry.size)})")


@app.command("list", help="List the checkpoints in DIR, newest first: step, epoch, size, and valid or why not."
                          " Every file is hashed. Exit 0 even when some are invalid; 2 bad usage.\n\n"
                          "Example: sprite ckpt list checkpoints/ --json")
def list_command(folder: str = typer.Argument(..., help="folder holding checkpoints"),
                 json_out: bool = typer.Option(False, "--json", help="print a JSON list")) -> None:
    from sprite.integrity import scan as ckpt_scan

    if not _exists(folder, "list").is_dir():
        raise UsageError(f"{folder} is not a folder.", "sprite ckpt list reads a folder of checkpoints.",
                         f"Run sprite ckpt verify {folder} for a single checkpoint.")
    entries = ckpt_scan.newest_first([ckpt_scan.inspect(path) for path in ckpt_scan.find([folder])])
    if json_out:
        typer.echo(json.dumps([entry.to_json() for entry in entries], indent=1))
        return
    _table(entries, folder)


def _table(entries, folder: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"checkpoints in {folder}")
    for column in ("checkpoint", "step", "epoch", "size", "status"):
        table.add_column(column, overflow="fold")
    for entry in entries:
        status = "valid" if entry.valid else f"invalid: {entry.reason}"
        table.add_row(entry.path.name, _text(entry.step), _text(entry.epoch), size_text(entry.size), status)
    Console(width=max(120, Console().width)).print(table)


def _text(value) -> str:
    return "-" if value is None else str(value)


@app.command("consolidate")
def consolidate_command(
    ckpt_dir: Path = typer.Argument(..., help="An FSDP2 sharded checkpoint (a torch.distributed.checkpoint folder"
                                              " saved by FSDP2Strategy/ModelParallelStrategy)."),
    out: Path = typer.Argument(..., help="The file to write; it must not exist."),
) -> None:
    """Write one checkpoint file that torch.load reads and a 1-device Lightning fit resumes from (ckpt_path=OUT).

    A sprite manifest is written beside OUT; a CKPT_DIR with a sprite manifest must match it first.

    Example: sprite ckpt consolidate checkpoints/last.ckpt full.ckpt
    """
    from sprite.runtime.ckpt.consolidate import consolidate

    done = consolidate(ckpt_dir, out)
    note = "verified against its manifest" if done["source_sealed"] else "no sprite manifest to verify it against"
    typer.echo(f"wrote {out} ({done['bytes']} bytes) from {ckpt_dir} ({note})")
