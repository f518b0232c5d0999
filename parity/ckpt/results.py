"""Role results on disk: one folder per role (or fault case), written once, sealed by sprite's integrity module.

A folder holds ``rank<r>.json`` (what rank r recorded) and, from rank 0, ``tensors.npz`` (full fp32 values for
the reported gaps); its manifest is written last. Paths are relative to the check's directory, so a copy of it
loads the same. No torch: the comparison reads results through ``load``.
"""

from __future__ import annotations

import io
import json
import pathlib

import numpy as np

from sprite import integrity
from sprite.integrity import owner_only
from sprite.parity.store import ResultError, clean

TENSORS = "tensors.npz"


def write(out: pathlib.Path, target: str, strategy, record: dict, arrays: dict) -> None:
    """Writes this rank's record (and rank 0's arrays) into ``out/target`` and, once every rank wrote, seals it.
    Every rank calls it; ``strategy`` gives the barrier.

    Raises IntegrityError if the folder or a file in it exists.
    """
    folder, rank = out / target, record["meta"]["rank"]
    if rank == 0:
        owner_only.make_dirs(folder.parent)
        integrity.make_dir_new(folder)
    strategy.barrier("sprite.ckpt_results.folder")
    text = json.dumps(clean(record), indent=1, sort_keys=True, allow_nan=False)
    integrity.write_new(folder / f"rank{rank}.json", text.encode())
    if rank == 0:
        buffer = io.BytesIO()
        np.savez(buffer, **arrays)
        integrity.write_new(folder / TENSORS, buffer.getvalue())
    strategy.barrier("sprite.ckpt_results.files")
    if rank == 0:
        integrity.seal(folder, {"result": target, "world": record["meta"]["world"]})
    strategy.barrier("sprite.ckpt_results.sealed")


def load(out: pathlib.Path, target: str) -> dict:
    """A sealed result: ``{"ranks": [record, ...], "tensors": {key: array}}``.

    Raises ResultError when the folder is missing, was not sealed (the role did not finish), or any file differs
    from its manifest (the reason names it).
    """
    folder = out / target
    verdict = integrity.verify(folder)
    if not verdict.valid:
        reason = verdict.reason.replace(f"{folder}", target)  # relative: the same text for a copy of DIR
        raise ResultError(f"Result {target} is not valid: {reason}.",
                          "The role did not finish (it failed, timed out or was never started), or a file in it was"
                          " changed after the run.", "Look at the role's log under logs/, then run the check again"
                          " into a fresh --out.")
    first = json.loads((folder / "rank0.json").read_text())
    world = first["meta"]["world"]
    ranks = [first] + [json.loads((folder / f"rank{rank}.json").read_text()) for rank in range(1, world)]
    with np.load(folder / TENSORS, allow_pickle=False) as archive:
        tensors = {key: archive[key] for key in archive.files}
    return {"ranks": ranks, "tensors": tensors}
