"""The stage archive: one uncompressed POSIX tar (stdlib tarfile) written once, hashed while it is written; on a
node, hashed in a first read and checked against its record before anything is extracted, then read again as a
stream and extracted. Every member is checked to stay inside the folder before it is extracted: an absolute name, a ``..`` step, a link whose target leaves the folder, a device or a fifo is refused.

Stdlib only besides sprite.errors: the per-node tool imports this before anything else.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import stat
import tarfile

from sprite.errors import SpriteError

TRUSTED = {"filter": "fully_trusted"} if hasattr(tarfile, "fully_trusted_filter") else {}
MANIFEST = "sprite-stage.json"  # the first member: what was staged and how the node rebuilds the interpreter
CHUNK = 1 << 20  # tarfile copies 16 KiB at a time by default: 60,000 Python-level steps for torch's library


class UnsafeArchive(SpriteError):
    """An archive member would land outside the stage folder, or the archive is not the one packed (exit 1)."""


class _Hashing(io.RawIOBase):
    """A file object passing reads or writes through and hashing the bytes (SHA-256)."""

    def __init__(self, raw) -> None:
        self.raw, self.digest, self.count = raw, hashlib.sha256(), 0

    def readable(self) -> bool:
        return True

    def writable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        n = self.raw.readinto(buffer)
        if n:
            self.digest.update(memoryview(buffer)[:n])
            self.count += n
        return n

    def tell(self) -> int:  # TarFile asks once, at the start
        return self.count

    def write(self, data) -> int:
        self.digest.update(data)
        self.count += len(data)
        return self.raw.write(data)


def pack(files: list, manifest: dict, fd: int) -> tuple[str, int]:
    """Write ``manifest`` then every (name, path, lstat) of ``files`` as a tar into the open ``fd``; returns
    (SHA-256 of the archive, its size). Symlinks are kept as links; owners are not recorded."""
    with os.fdopen(os.dup(fd), "wb", buffering=CHUNK) as raw:
        sink = _Hashing(raw)
        # Mode "w", not the stream mode "w|": tarfile's _Stream re-slices its buffer on every write, which took
        # half of the time to pack torch (cProfile, Python 3.11.7).
        with tarfile.open(fileobj=sink, mode="w", format=tarfile.PAX_FORMAT, copybufsize=CHUNK) as tar:
            body = json.dumps(manifest, sort_keys=True).encode()
            info = tarfile.TarInfo(MANIFEST)
            info.size, info.mode = len(body), 0o644
            tar.addfile(info, io.BytesIO(body))
            for name, path, st in files:
                info = _info(name, path, st)
                if info is None:  # a socket or device: nothing Python imports
                    continue
                if info.isreg():
                    with open(path, "rb") as src:
                        tar.addfile(info, src)
                else:
                    tar.addfile(info)
    return sink.digest.hexdigest(), sink.count


def _info(name: str, path: str, st: os.stat_result) -> tarfile.TarInfo | None:
    """The header of one entry from its lstat: no owner lookups (tarfile's gettarinfo asks the user database for
    every file), whole-second mtimes (what a .pyc records of its source, and no PAX record per member)."""
    info = tarfile.TarInfo(name)
    info.mode, info.mtime = stat.S_IMODE(st.st_mode), int(st.st_mtime)
    if stat.S_ISREG(st.st_mode):
        info.size = st.st_size
    elif stat.S_ISDIR(st.st_mode):
        info.type = tarfile.DIRTYPE
    elif stat.S_ISLNK(st.st_mode):
        info.type, info.linkname = tarfile.SYMTYPE, os.readlink(path)
    else:
        return None
    return info


def check_member(member: tarfile.TarInfo, dest: str) -> None:
    """Raise UnsafeArchive unless ``member`` is a file, folder or link that stays inside ``dest``."""
    name = member.name
    target = os.path.normpath(os.path.join(dest, name))
    if os.path.isabs(name) or "\0" in name or ".." in name.split("/") or not _inside(target, dest):
        raise _unsafe(name, "its name leaves the folder")
    if member.islnk():
        raise _unsafe(name, "it is a hard link (sprite's archives hold none)")
    if member.issym():
        # A relative target without ".." only goes down from the link's own folder, whatever links it passes
        # through, so every link stays inside; a lexical check alone would let s -> . and t -> s/s/.. out.
        link = member.linkname
        if os.path.isabs(link) or "\0" in link or ".." in link.split("/"):
            raise _unsafe(name, f"its link target {link} may leave the folder")
    elif not (member.isreg() or member.isdir()):
        raise _unsafe(name, "it is a device, fifo or other special file")


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _unsafe(name: str, why: str) -> UnsafeArchive:
    return UnsafeArchive(f"The stage archive's member {name!r} was refused: {why}.",
                         "The archive was not written by sprite, or was altered.",
                         "Remove the archive from the stage cache and launch again to pack a new one.")


def digest(path: str) -> str:
    """SHA-256 of the file at ``path``, read 1 MiB at a time."""
    sha = hashlib.sha256()
    with open(path, "rb", buffering=0) as src:
        for block in iter(lambda: src.read(CHUNK), b""):
            sha.update(block)
    return sha.hexdigest()


def unpack(archive: str, dest: str, expect: str | None) -> tuple[dict, int]:
    """Check the SHA-256 of ``archive`` against ``expect``, then extract it into the existing folder ``dest``
    member by member, each checked first; mtimes are kept, so the packed ``.pyc`` files stay valid. Returns (the
    manifest, the archive's size).

    Raises UnsafeArchive for a member that would leave ``dest`` or an archive whose SHA-256 is not ``expect``.
    """
    dest = os.path.abspath(dest)
    manifest = {}
    size = os.path.getsize(archive)
    if expect and digest(archive) != expect:  # before anything is extracted
        raise UnsafeArchive(f"The stage archive {archive} does not hash to the SHA-256 recorded when it was packed.",
                            "It was altered, or its copy on this node is incomplete.",
                            "Remove it from the stage cache and launch again.")
    with tarfile.open(archive, mode="r:", copybufsize=CHUNK) as tar:
        for member in tar:
            check_member(member, dest)
            if member.name == MANIFEST:
                manifest = json.loads(tar.extractfile(member).read())
                continue
            member.mode &= 0o755  # no setuid, setgid or sticky bit, no group or other write
            member.uid = member.gid = os.geteuid()
            # check_member is the whole check; tarfile's "data" filter would do it again with a realpath()
            # of every member (a stat of each folder on its path), which doubled the time to unpack torch.
            tar.extract(member, dest, set_attrs=True, numeric_owner=True, **TRUSTED)
    return manifest, size
