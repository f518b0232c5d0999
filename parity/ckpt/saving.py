"""Checkpoints of the check: every save goes to a new name and comes out sealed by sprite's runtime.

The ranks run under ``python -m sprite.runtime``, which seals every ``Trainer.save_checkpoint``
(``sprite.runtime.ckpt.seal``: the state is copied off the device, then each rank writes and hashes its files
in the background and rank 0 seals once all confirmed). The check adds only what it needs on top: the name must be new on every rank before
anyone saves (nothing is overwritten), and the save must verify afterwards. Only rank workers import it.
"""

from __future__ import annotations

import os
import pathlib

from sprite import integrity
from sprite.integrity import owner_only


def save_sealed(trainer, path: pathlib.Path) -> str:
    """Saves the trainer's checkpoint at ``path`` (a folder for a sharded FSDP2 save, else a file) and returns the
    sha256 of its manifest on rank 0 ("" elsewhere). Every rank must call it.

    Raises IntegrityError on every rank if ``path`` exists, and on rank 0 if the save did not come out sealed
    (the runtime says why on rank 0's output).
    """
    strategy = trainer.strategy
    if os.path.lexists(path):
        raise integrity.IntegrityError(f"{path} exists already; refusing to save a checkpoint over it.",
                                       "An earlier run wrote there.", "Save into a fresh directory.")
    if trainer.global_rank == 0:
        owner_only.make_dirs(path.parent)
    strategy.barrier("sprite.ckpt_check.name_checked")  # every rank looked before anyone writes
    trainer.save_checkpoint(path)
    # The runtime saves in the background (sprite.runtime.ckpt.background): every rank waits until this save
    # is sealed, since the check's next step reads it, and the seal's collectives need every rank's report.
    from sprite.runtime.ckpt import durable

    durable.wait()
    if trainer.global_rank != 0:
        return ""
    verdict = integrity.verify(path)
    if not verdict.valid:
        raise integrity.IntegrityError(f"Checkpoint {path} is not sealed: {verdict.reason}.",
                                       "The save or its seal failed on some rank.", "Read the launch's log.")
    return integrity.sha256_file(integrity.manifest_path(path))
