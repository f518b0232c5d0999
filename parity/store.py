"""Arm results on disk: one namespace per arm, never overwritten, sealed by a manifest of sha256 digests.

Layout of an arm directory: ``rank<r>.json`` (numbers and digests recorded by rank r), ``tensors.npz``
(rank 0's full tensors) and ``manifest.json`` (written last by rank 0; an arm without it is incomplete).
Paths inside are relative, so a copied run directory compares the same. No torch here.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import pathlib

import numpy as np

from sprite import integrity, owner_only
from sprite.errors import SpriteError

MANIFEST = "manifest.json"
TENSORS = "tensors.npz"


class ResultError(SpriteError):
    """A saved arm result is missing, incomplete or does not match its manifest."""


def clean(value):
    """Returns ``value`` with every non-finite float replaced by None, so JSON stays NaN-free."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: clean(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(item) for item in value]
    return value


def write_new(path: pathlib.Path, data: bytes) -> None:
    """Writes ``data`` to a new 0600 file through ``sprite.integrity`` (never over a file, never via a symlink).

    Raises ResultError if the name exists: an arm never overwrites a result, partial or complete.
    """
    try:
        integrity.write_new(path, data)
    except integrity.IntegrityError:
        _refuse(path)


def _refuse(path: pathlib.Path) -> None:
    raise ResultError(
        f"{path} already exists; refusing to overwrite an arm result.",
        "The output directory was used by an earlier run.",
        "Pass a fresh --out directory.",
    )


def claim(arm_dir: pathlib.Path, rank: int) -> None:
    """Checks, before any training, that this rank's files do not exist yet. Raises ResultError if they do."""
    owner_only.make_dirs(arm_dir)
    for name in (f"rank{rank}.json", MANIFEST, TENSORS if rank == 0 else None):
        if name and (arm_dir / name).exists():
            _refuse(arm_dir / name)


def write_rank(arm_dir: pathlib.Path, rank: int, record: dict) -> None:
    """Writes one rank's record as NaN-free JSON. Raises ResultError if it exists."""
    text = json.dumps(clean(record), indent=1, sort_keys=True, allow_nan=False)
    write_new(arm_dir / f"rank{rank}.json", text.encode())


def write_tensors(arm_dir: pathlib.Path, arrays: dict[str, np.ndarray]) -> None:
    """Writes rank 0's tensors (float32 arrays keyed by kind/step/name). Raises ResultError if they exist."""
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    write_new(arm_dir / TENSORS, buffer.getvalue())


def seal(arm_dir: pathlib.Path, world: int) -> None:
    """Writes the manifest (sha256 of every result file) once all ranks wrote theirs. Raises ResultError."""
    names = [f"rank{rank}.json" for rank in range(world)] + [TENSORS]
    files = {name: _sha256(arm_dir / name) for name in names}
    write_new(arm_dir / MANIFEST, json.dumps({"world": world, "files": files}, indent=1).encode())


def _sha256(path: pathlib.Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def load_arm(arm_dir: pathlib.Path) -> dict:
    """Loads a sealed arm: ``{"ranks": [record, ...], "tensors": {key: array}}``.

    Raises ResultError when the manifest is missing or unreadable, or a file is missing or differs from the
    digest recorded when the arm finished.
    """
    label = os.fspath(arm_dir)
    try:
        manifest = json.loads((arm_dir / MANIFEST).read_text())
    except (OSError, ValueError) as err:
        raise ResultError(
            f"Arm result {label} has no readable {MANIFEST} ({err.__class__.__name__}).",
            "The arm did not finish (it failed, was killed, or is still running) or the file was damaged.",
            "Look at the arm's log under logs/, then run the check again into a fresh --out directory.",
        ) from None
    for name, digest in manifest["files"].items():
        path = arm_dir / name
        if not path.is_file() or _sha256(path) != digest:
            raise ResultError(
                f"Arm result {label}/{name} is missing or does not match the sha256 recorded when the arm finished.",
                "The file was edited, truncated or replaced after the run.",
                "Restore the original file or run the check again into a fresh --out directory.",
            )
    ranks = [json.loads((arm_dir / f"rank{rank}.json").read_text()) for rank in range(manifest["world"])]
    with np.load(arm_dir / TENSORS, allow_pickle=False) as archive:
        tensors = {key: archive[key] for key in archive.files}
    return {"ranks": ranks, "tensors": tensors}
