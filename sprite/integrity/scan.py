"""Find the checkpoints in folders, read what their manifests say, and choose the newest one that verifies.

Torch-free: ``sprite ckpt list`` and the runtime's ``--resume auto`` both use it. A checkpoint is an entry of a
folder (not hidden, not a symlink) that is named ``*.ckpt`` or carries a sprite manifest: a file with
``<name>.sprite-manifest.json`` beside it, or a folder (a torch.distributed.checkpoint save) with one inside.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Optional

from sprite import integrity


@dataclass(frozen=True)
class Entry:
    """One checkpoint and what is known about it; ``reason`` says why it is not valid ("" when it is)."""

    path: Path
    valid: Optional[bool]  # None: not verified (only its manifest was read)
    reason: str
    step: Optional[int] = None
    epoch: Optional[int] = None
    size: Optional[int] = None  # bytes of the files the manifest lists
    sealed: str = ""  # the manifest's time stamp

    def to_json(self) -> dict:
        return {"path": os.fspath(self.path), "valid": self.valid, "reason": self.reason, "step": self.step,
                "epoch": self.epoch, "size": self.size, "sealed": self.sealed}


def _is_checkpoint(path: Path) -> bool:
    if path.name.startswith(".") or path.is_symlink() or path.name.endswith(integrity.MANIFEST_SUFFIX):
        return False
    return path.suffix == ".ckpt" or os.path.lexists(integrity.manifest_path(path))


def find(folders: Iterable) -> list[Path]:
    """Every checkpoint directly inside ``folders`` (missing folders are skipped), without duplicates."""
    found: dict[str, Path] = {}
    for folder in folders:
        folder = Path(folder)
        if folder.is_dir():
            for path in sorted(folder.iterdir()):
                if _is_checkpoint(path):
                    found.setdefault(os.path.realpath(path), path)
    return list(found.values())


def inspect(path, verify: bool = True) -> Entry:
    """``path``'s manifest facts; with ``verify`` also whether every file matches (reads and hashes them all)."""
    path = Path(path)
    if verify:
        verdict = integrity.verify(path)
        body, valid, reason = verdict.manifest, verdict.valid, verdict.reason
    else:
        try:
            body, valid, reason = integrity.read_manifest(path), None, ""
        except integrity.IntegrityError as err:
            body, valid, reason = None, False, err.what
    if body is None:
        return Entry(path, False, reason)
    meta = body.get("meta") if isinstance(body.get("meta"), dict) else {}
    size = sum(entry.get("size", 0) for entry in body["files"].values() if isinstance(entry, dict))
    return Entry(path, valid, reason, _int(meta.get("step")), _int(meta.get("epoch")), size, str(meta.get("time", "")))


def _int(value) -> Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def newest_first(entries: list[Entry]) -> list[Entry]:
    """Entries with a readable manifest by step, then seal time, newest first; the others after them."""
    readable = [e for e in entries if e.step is not None]
    rest = [e for e in entries if e.step is None]
    readable.sort(key=lambda e: (e.step, e.sealed), reverse=True)
    return readable + rest


def _mtime(path: Path) -> float:
    try:
        return os.lstat(path).st_mtime
    except OSError:
        return 0.0


def listed(folders: Iterable) -> tuple[list[Entry], int]:
    """``(entries, found)``: the checkpoints in ``folders`` with what their manifests say (nothing hashed yet),
    newest first, and how many were found."""
    paths = find(folders)
    return newest_first([inspect(path, verify=False) for path in paths]), len(paths)


def pick(entries: list[Entry], check: Callable[[Path], integrity.Verdict]) -> tuple[Optional[Entry], list[Entry]]:
    """``(chosen, skipped)`` among ``listed`` entries: the first whose ``check`` (``integrity.verify`` or the
    runtime's verification shared by the ranks) finds valid (None if none does), and the invalid ones passed over
    to get there (every invalid one when none is chosen).

    Verification hashes every file, so only as many checkpoints are checked as it takes to find a valid one.
    A checkpoint with no readable manifest (a save cut short) is reported when it is not older than the choice.
    """
    skipped = [entry for entry in entries if entry.step is None]
    chosen = None
    for entry in entries:
        if entry.step is None:
            continue
        verdict = check(entry.path)
        if verdict.valid:
            chosen = dataclasses.replace(entry, valid=True, reason="")
            break
        skipped.append(dataclasses.replace(entry, valid=False, reason=verdict.reason))
    if chosen is not None:
        cutoff = _mtime(integrity.manifest_path(chosen.path))
        skipped = [e for e in skipped if e.step is not None or _mtime(e.path) >= cutoff]
    return chosen, skipped


def choose(folders: Iterable) -> tuple[Optional[Entry], list[Entry], int]:
    """``(chosen, skipped, found)``: :func:`pick` over :func:`listed`, each candidate verified in this process."""
    entries, found = listed(folders)
    return (*pick(entries, integrity.verify), found)
