"""`sprite ckpt ...`: work on checkpoints. Mount ``app`` as `sprite ckpt`; torch is imported only inside commands.

    sprite ckpt consolidate CKPT_DIR OUT    # FSDP2 sharded checkpoint -> one file a 1-device fit resumes from
"""

from __future__ import annotations

import pathlib

import typer

app = typer.Typer(name="ckpt", no_args_is_help=True, add_completion=False, help="Work on checkpoints.")


@app.command("consolidate")
def consolidate_command(
    ckpt_dir: pathlib.Path = typer.Argument(..., help="An FSDP2 sharded checkpoint (a torch.distributed.checkpoint"
                                                     " folder saved by FSDP2Strategy/ModelParallelStrategy)."),
    out: pathlib.Path = typer.Argument(..., help="The file to write; it must not exist."),
) -> None:
    """Write one checkpoint file that torch.load reads and a 1-device Lightning fit resumes from (ckpt_path=OUT).

    A sprite manifest is written beside OUT; a CKPT_DIR with a sprite manifest must match it first.
    """
    from sprite.consolidate import consolidate

    done = consolidate(ckpt_dir, out)
    note = "verified against its manifest" if done["source_sealed"] else "no sprite manifest to verify it against"
    typer.echo(f"wrote {out} ({done['bytes']} bytes) from {ckpt_dir} ({note})")
