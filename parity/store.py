"""Arm results on disk: one namespace per arm, never overwritten, sealed by a manifest of sha256 digests.

Layout of an arm directory: ``rank<r>.json`` (numbers and digests recorded by rank r), ``tensors.npz``
(rank 0's full tensors) and ``sprite-manifest.json`` (``sprite.integrity``'s seal, written last by rank 0; an arm
without it is incomplete). Every file is created once, 0600. Paths inside are relative, so a copied run directory
compares the same. No torch here.
"""

from __future__ import annotations

import io
import json
import math
import os
import pathlib

import numpy as np

from sprite import integrity
from sprite.integrity import owner_only
from sprite.errors import SpriteError

TENSORS = "tensors.npz"


class ResultError(SpriteError):
    """A saved arm result is missing, incomplete or does not match its manifest."""


SETTINGS = "run.json"  # a check's settings, sealed as it starts (parity's and ckpt-check's)
PARITY = "sprite parity settings"  # the check each one's manifest names (its meta's "what")
CKPT_CHECK = "sprite ckpt-check settings"


def write_settings(out: pathlib.Path, data: bytes, what: str) -> None:
    """Writes a check's settings to a new ``out/run.json`` and seals it with ``what`` in its manifest (the check's
    name), so that an edit after the run (a fault left out of the settings skips its report) fails the compare."""
    integrity.write_new(out / SETTINGS, data)
    integrity.seal(out / SETTINGS, {"what": what})


def read_settings(out: pathlib.Path, what: str, command: str) -> dict:
    """The settings ``write_settings`` sealed in ``out`` for the check named ``what``, as a dict. Raises UsageError
    when ``out`` holds none of that check's (no run.json, no manifest, another check's), ResultError when the
    file changed after the run. ``command``: the check's command, for the messages."""
    from sprite.errors import UsageError

    path = out / SETTINGS
    fix = f"Pass the --out directory of a `{command}` run."
    if not path.is_file():
        raise UsageError(f"{out} holds no {SETTINGS}.", f"It is not the --out directory of a `{command}` run.", fix)
    verdict = integrity.verify(path)
    if verdict.manifest is None and not os.path.lexists(integrity.manifest_path(path)):
        raise UsageError(f"{path} has no manifest, so {out} cannot be compared as a `{command}` run.",
                         "It is another check's folder, a run written before sprite sealed its settings (2026-12-05), "
                         "or its manifest was removed.", fix + " An older run's verdict is in its report files.")
    if not verdict.valid:
        raise ResultError(f"{path} is not valid: {verdict.reason.rstrip('.')}.", "It was changed after the run.",
                          "Run the check again into a fresh --out.")
    found = (verdict.manifest.get("meta") or {}).get("what")
    if found != what:
        raise UsageError(f"{out} holds the settings of {str(found)[:60]!r}, not of {what!r}.",
                         "It is the --out of another check.", fix)
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict):
            raise TypeError(f"it holds a {type(data).__name__}, not an object")
    except (OSError, ValueError, TypeError) as err:
        raise ResultError(f"{path} cannot be read ({type(err).__name__}: {str(err)[:120]}).",
                          "It changed after its manifest was checked, or the disk failed.",
                          "Run the check again into a fresh --out.") from None
    return data


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


def _names(world: int) -> list[str]:
    return [f"rank{rank}.json" for rank in range(world)] + [TENSORS]


def claim(arm_dir: pathlib.Path, rank: int) -> None:
    """Checks, before any training, that this rank's files do not exist yet. Raises ResultError if they do."""
    owner_only.make_dirs(arm_dir)  # 0700, parents too
    for path in (arm_dir / f"rank{rank}.json", integrity.manifest_path(arm_dir), arm_dir / TENSORS if rank == 0 else None):
        if path and os.path.lexists(path):
            _refuse(path)


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
    """Seals the arm (size and sha256 of every result file) once all ranks wrote theirs. Raises ResultError."""
    try:
        integrity.seal(arm_dir, {"world": world}, integrity.describe(arm_dir, _names(world)))
    except (integrity.IntegrityError, FileNotFoundError) as err:
        raise ResultError(f"Cannot seal arm result {arm_dir}: {err}", "A rank did not write its record, or the"
                          " arm ran twice into one directory.", "Run the check again into a fresh --out.") from None


def load_arm(arm_dir: pathlib.Path) -> dict:
    """Loads a sealed arm: ``{"ranks": [record, ...], "tensors": {key: array}}``.

    Raises ResultError when the manifest is missing or unreadable, or a file is missing, unlisted or differs from
    the size and digest recorded when the arm finished.
    """
    label = os.fspath(arm_dir)
    verdict = integrity.verify(arm_dir)
    if verdict.manifest is None:
        raise ResultError(
            f"Arm result {label} has no readable manifest ({verdict.reason}).",
            "The arm did not finish (it failed, was killed, or is still running) or the file was damaged.",
            "Look at the arm's log under logs/, then run the check again into a fresh --out directory.",
        )
    if not verdict.valid:
        name = next((n for n in sorted(verdict.manifest["files"]) if f": {n} " in verdict.reason), "a file")
        raise ResultError(
            f"Arm result {label}/{name} is missing or does not match the sha256 recorded when the arm finished"
            f" ({verdict.reason}).",
            "The file was edited, truncated or replaced after the run.",
            "Restore the original file or run the check again into a fresh --out directory.",
        )
    world = verdict.manifest["meta"]["world"]
    ranks = [json.loads((arm_dir / f"rank{rank}.json").read_text()) for rank in range(world)]
    with np.load(arm_dir / TENSORS, allow_pickle=False) as archive:
        tensors = {key: archive[key] for key in archive.files}
    return {"ranks": ranks, "tensors": tensors}
