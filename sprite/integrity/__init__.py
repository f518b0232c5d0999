"""Write files once, hash them, seal a file or folder with a manifest written last, and verify it. Stdlib only.

The file primitives (write once, fsync, hash) live in ``sprite.integrity.writeonce``, the manifest's layout and its
verification in ``sprite.integrity.manifest``; both are re-exported here, so callers need only this module.
A sealed target is valid only while its manifest verifies: every listed file is present with the recorded size
and SHA-256, a sealed folder holds no unlisted file, and the manifest itself is intact. The manifest is canonical
JSON (sorted keys, ASCII) carrying the SHA-256 of its own body, so any edit of it, even of one byte, is refused.
Nothing here replaces, truncates, chmods or follows a symlink to an existing file.
"""

from __future__ import annotations

import errno
import os
import secrets
from pathlib import Path
from typing import Optional

from sprite.integrity import canonical
from sprite.integrity.manifest import (MANIFEST_NAME, MANIFEST_SUFFIX, VERSION, Verdict, check_digests, check_listing,
                             describe, manifest_path, read_manifest, verify)
from sprite.integrity.writeonce import IntegrityError, exists_error, fsync_dir, fsync_file, make_dir_new, sha256_file, write_new

__all__ = ["IntegrityError", "Verdict", "write_new", "make_dir_new", "fsync_dir", "fsync_file", "sha256_file",
           "describe", "manifest_path", "seal", "read_manifest", "verify", "check_listing", "check_digests",
           "MANIFEST_NAME", "MANIFEST_SUFFIX", "VERSION"]


def seal(target, meta: dict, files: Optional[dict] = None, sync: bool = True, name: Optional[str] = None) -> Path:
    """Write ``target``'s manifest last and atomically: a temporary name, fsync, a hard link to the final name
    (never replacing one), unlink of the temporary name, fsync of the folder. ``files`` defaults to
    ``describe(target)``. ``sync`` False: no fsync of the manifest or its folder (the caller does both later).
    ``name``: the name the manifest describes, when ``target`` is still under a temporary one (a checkpoint sealed
    before it replaces one of that name; a file's manifest must then follow it to its name). Returns the
    manifest's path.

    Raises:
        IntegrityError: the target is missing or already has a manifest. OSError on I/O failure.
    """
    target = Path(target)
    if not target.exists():
        raise IntegrityError(f"Cannot seal {target}: it does not exist.", "The save did not write it.",
                             "Seal only after every rank has written its files.")
    final = manifest_path(target)
    if os.path.lexists(final):
        raise exists_error(final, "a manifest")
    kind = "dir" if target.is_dir() else "file"
    body = {"sprite_manifest": VERSION, "kind": kind, "name": name or target.name, "meta": meta,
            "files": describe(target) if files is None else files}
    temp = final.parent / f".{MANIFEST_NAME}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
    write_new(temp, canonical.sealed(body), 0o600, sync=sync)
    try:
        _publish(temp, final)
    finally:
        if os.path.lexists(temp):
            os.unlink(temp)
    if sync:
        fsync_dir(final.parent)
    return final


def _publish(temp: Path, final: Path) -> None:
    """Give ``temp`` the name ``final`` without ever replacing an existing ``final``."""
    try:
        os.link(temp, final)
    except FileExistsError:
        raise exists_error(final, "a manifest") from None
    except OSError as err:  # a file system without hard links: a rename after a fresh check is the best left
        if err.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP) or os.path.lexists(final):
            raise
        os.rename(temp, final)


