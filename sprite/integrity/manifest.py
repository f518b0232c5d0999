"""The manifest of a sealed checkpoint or result: where it lives, what it lists, and whether the target matches.

A manifest is ``sprite.integrity.canonical`` JSON (it carries the SHA-256 of its own content) holding ``kind`` (file or
dir), ``name``, ``meta`` and ``files`` (``{relpath: {"size", "sha256"}}``, or for a file over 64 MiB
``{"size", "chunk_bytes", "sha256_chunks"}``: see ``sprite.integrity.digest``). Stdlib only; ``sprite.integrity``
writes manifests and re-exports what is here.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path, PurePosixPath
from typing import NamedTuple, Optional

from sprite.integrity import canonical, dcp_metadata, digest, records
from sprite.integrity.writeonce import IntegrityError

MANIFEST_NAME = "sprite-manifest.json"  # inside a sealed folder
MANIFEST_SUFFIX = ".sprite-manifest.json"  # beside a sealed file
VERSION = 1


class Verdict(NamedTuple):
    valid: bool
    reason: str  # "" when valid; else what is wrong, naming the file
    manifest: Optional[dict]  # the manifest body when it could be read, else None


def manifest_path(target) -> Path:
    """``target/sprite-manifest.json`` for a folder, ``<file>.sprite-manifest.json`` beside anything else."""
    target = Path(target)
    return target / MANIFEST_NAME if target.is_dir() else target.with_name(target.name + MANIFEST_SUFFIX)


def _is_ours(name: str) -> bool:
    return name == MANIFEST_NAME or (name.startswith(f".{MANIFEST_NAME}.") and name.endswith(".tmp"))


def describe(root, names=None) -> dict:
    """``{relpath: entry}`` (``sprite.integrity.digest``'s description) for ``names`` (relative to folder ``root``), or for
    every file under it (the manifest excluded) when ``names`` is None; a file ``root`` describes itself under its
    own name.

    Raises:
        IntegrityError: a listed entry is a symlink or not a regular file. OSError: a file cannot be read.
    """
    root = Path(root)
    if names is None:
        names = [root.name] if root.is_file() else _walk(root)
        root = root.parent if root.is_file() else root
    names = sorted(names)
    for name in names:
        if not stat.S_ISREG(os.lstat(root / name).st_mode):
            raise IntegrityError(f"{root / name} is not a regular file (a symlink, folder or device).",
                                 "Only regular files can be sealed.", "Remove it from the checkpoint folder.")
    entries = digest.files([root / name for name in names])
    return {Path(name).as_posix(): entry for name, entry in zip(names, entries)}


def _walk(root: Path) -> list[str]:
    """Every file and symlink under ``root`` (symlinked folders are listed, not entered), sprite's own excluded.
    Iterative: a chain of thousands of nested folders is walked like any other."""
    found, pending = [], [os.fspath(root)]
    while pending:
        folder = pending.pop()
        with os.scandir(folder) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    pending.append(entry.path)
                elif not (folder == os.fspath(root) and _is_ours(entry.name)):
                    found.append(Path(os.path.relpath(entry.path, root)).as_posix())
    return sorted(found)


def read_manifest(target) -> dict:
    """The manifest body of a sealed ``target``: a regular file (never a symlink, a FIFO or over
    ``records.MANIFEST_MAX`` bytes) holding a well-formed version-``VERSION`` manifest.

    Raises:
        IntegrityError: the manifest is missing, unreadable, changed, malformed or not sprite's.
    """
    path = manifest_path(target)
    try:
        body = canonical.unseal(records.read(path, records.MANIFEST_MAX))
    except FileNotFoundError:
        raise IntegrityError(f"{target} has no manifest ({path.name}).", "It was not saved under sprite, its save"
                             " did not finish (the job was killed or failed while writing), or the manifest was"
                             " removed.", "Use another checkpoint.") from None
    except (OSError, ValueError) as err:
        raise IntegrityError(f"The manifest {path} is unreadable: {getattr(err, 'strerror', None) or err}.",
                             "It was edited or damaged after the save.", "Use another checkpoint.") from None
    if type(body.get("sprite_manifest")) is not int or body["sprite_manifest"] != VERSION:
        raise IntegrityError(f"The manifest {path} is not a version-{VERSION} sprite manifest.",
                             "Another program or sprite version wrote it.", "Use another checkpoint.")
    problem = _malformed(body)
    if problem:
        raise IntegrityError(f"The manifest {path} is malformed: {problem}.", "It was edited by hand or written by"
                             " another program.", "Use another checkpoint.")
    return body


_HEX = re.compile(r"[0-9a-f]{64}")


def _malformed(body: dict) -> str:
    """What is wrong with the shape of a manifest body ("" when nothing): kind, name, meta, and a non-empty
    ``files`` of safe relative paths, each with an integer size and SHA-256 digests (a file target lists only
    itself: see check_listing)."""
    if body.get("kind") not in ("dir", "file") or not isinstance(body.get("name"), str):
        return "its kind or name is missing"
    if not isinstance(body.get("meta", {}), dict):
        return "its meta is not an object"
    files = body.get("files")
    if not isinstance(files, dict) or not files:
        return "it lists no file"
    for rel, entry in files.items():
        if PurePosixPath(rel).as_posix() != rel or rel.startswith("/") or {".", ".."} & set(rel.split("/")):
            return f"it lists an unsafe path {rel[:200]!r}"
        if not isinstance(entry, dict) or type(entry.get("size")) is not int or entry["size"] < 0:
            return f"the entry of {rel[:200]!r} has no size"
        if "sha256_chunks" in entry:
            chunks = entry["sha256_chunks"]
            good = type(entry.get("chunk_bytes")) is int and isinstance(chunks, list) and bool(chunks)
            if not good or not all(isinstance(one, str) and _HEX.fullmatch(one) for one in chunks):
                return f"the entry of {rel[:200]!r} has malformed chunk digests"
        elif not isinstance(entry.get("sha256"), str) or not _HEX.fullmatch(entry["sha256"]):
            return f"the entry of {rel[:200]!r} has no SHA-256"
    return ""


def verify(target) -> Verdict:
    """Whether ``target`` (a sealed file or folder) matches its manifest; the reason names the first problem:
    no manifest, an unreadable or edited manifest, a missing file, a size or SHA-256 mismatch, or an unlisted
    file in a sealed folder. Never raises for a bad target (OSError while reading becomes the reason)."""
    verdict = check_listing(target)
    return check_digests(target, verdict.manifest, sorted(verdict.manifest["files"])) if verdict.valid else verdict


def check_listing(target) -> Verdict:
    """Everything :func:`verify` checks but the digests: the manifest, and every listed file present with its
    size (no unlisted one in a folder). Cheap: file system metadata and the manifest only. Never raises."""
    target = Path(target)
    if not os.path.lexists(target):
        return Verdict(False, f"{target} does not exist", None)
    try:
        body = read_manifest(target)
    except IntegrityError as err:
        return Verdict(False, err.what, None)
    name = Path(os.path.abspath(target)).name  # "." or "dir/.." name the folder they stand for
    if (body["kind"] == "dir") != target.is_dir() or body["name"] != name:
        return Verdict(False, f"the manifest of {target} describes another target ({body['name'][:200]!r})", body)
    if body["kind"] == "file" and set(body["files"]) != {name}:
        return Verdict(False, f"the manifest of {target} lists other files than {name}", body)
    root = _root(target, body)
    try:
        problem = _check_sizes(root, body["files"]) or (_unlisted(root, body["files"]) if target.is_dir() else "")
    except OSError as err:
        problem = f"reading it failed: {err}"
    return Verdict(not problem, f"{target}: {problem}" if problem else "", body)


def check_digests(target, body: dict, names: list[str]) -> Verdict:
    """Whether the files ``names`` (relative paths the manifest ``body`` lists) match their digests: one share
    of :func:`verify`'s work, for checks spread over ranks. Never raises."""
    target = Path(target)
    root = _root(target, body)
    try:
        found = digest.files([root / name for name in names])
        problem = next((f"{name} does not match its SHA-256 in the manifest (changed after the save)"
                        for name, description in zip(names, found)
                        if not digest.same(description, body["files"][name])), "")
        if not problem and body.get("kind") == "dir" and METADATA in names:
            problem = _metadata_problem(root / METADATA)
    except OSError as err:
        problem = f"reading it failed: {err}"
    return Verdict(not problem, f"{target}: {problem}" if problem else "", body)


METADATA = ".metadata"  # torch.distributed.checkpoint's pickled metadata (filesystem.py _metadata_fn, torch 2.13)


def _metadata_problem(path: Path) -> str:
    """Why the ``.metadata`` of a sealed folder must not be unpickled ("" when it holds torch's metadata only):
    the manifest proves the file unchanged since sealing, not that sprite or torch wrote it."""
    problem = dcp_metadata.check(records.read(path, dcp_metadata.METADATA_MAX))
    return f"{METADATA} is refused, never unpickled: {problem}" if problem else ""


def _root(target: Path, body: dict) -> Path:
    return target if body.get("kind") == "dir" else target.parent


def _check_sizes(root: Path, files: dict) -> str:
    """Each listed path safe (inside ``root``, through no symlink), present, a regular file of the recorded size
    (catches a partial write)."""
    for rel, entry in sorted(files.items()):
        parts = Path(rel).parts
        if Path(rel).is_absolute() or ".." in parts or not parts:
            return f"the manifest lists an unsafe path {rel!r}"
        path = root / rel
        for depth in range(1, len(parts)):
            mode = _lstat_mode(root.joinpath(*parts[:depth]))
            if not stat.S_ISDIR(mode):
                return f"{rel} is missing" if not mode else \
                    f"{Path(*parts[:depth]).as_posix()} (on the way to {rel}) is not a folder (a symlink?)"
        if not os.path.lexists(path):
            return f"{rel} is missing"
        info = os.lstat(path)
        if not stat.S_ISREG(info.st_mode):
            return f"{rel} is not a regular file"
        if info.st_size != entry.get("size"):
            return f"{rel} has {info.st_size} bytes, the manifest says {entry.get('size')}"
    return ""


def _lstat_mode(path: Path) -> int:
    try:
        return os.lstat(path).st_mode
    except FileNotFoundError:
        return 0


def _unlisted(root: Path, files: dict) -> str:
    extra = sorted(set(_walk(root)) - {Path(rel).as_posix() for rel in files})
    return f"{_short(extra[0])} is not listed in the manifest" + (f" (and {len(extra) - 1} more)" if extra[1:]
                                                                   else "") if extra else ""


def _short(rel: str) -> str:
    """A relative path for a message: a deep one keeps its start and end."""
    return rel if len(rel) <= 160 else f"{rel[:60]}...{rel[-60:]}"
