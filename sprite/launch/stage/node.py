"""``python -m sprite.launch.stage.node ACTION --dir D --token T ...``: the part of ``--stage`` that runs once on
every node, started by the job's own launcher with one process per node.

claim   make the folder ``D`` (mode 0700) with sprite's marker; a folder that exists is refused unless it is
        this run's (its marker names token ``T``): sprite never writes into a folder it did not make
unpack  claim, then extract the archive into ``D``, check its SHA-256, write the venv's ``pyvenv.cfg`` and
        ``bin/pythonX.Y`` link, mark it ready. When another process of this run holds the folder (two simulated
        nodes on one machine share its /tmp, or ``--stage`` names a shared file system), wait until that one
        marked it ready, or failed.
remove  remove ``D`` if its marker names token ``T``; anything else is left alone. Of the processes of this run
        that share the folder, the one that renames it aside removes it.

Exit status: 0 done, 1 the archive failed its checks or the wait timed out, 2 the folder is not this run's.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import socket
import sys
import time

from sprite.errors import EXIT_USAGE, SpriteError, UsageError, report
from sprite.launch.stage import archive as archmod

MARKER = ".sprite-stage"  # JSON {"token", "host", "pid"}: written once, when sprite made the folder
READY = ".sprite-stage-ready"  # JSON {"sha256", "seconds", "bytes"}: written once, when the copy is complete
UNPACKING = ".sprite-stage-unpacking"  # created once: the process that made it unpacks, others wait
FAILED = ".sprite-stage-failed"  # JSON {"host", "error"}: the unpacker failed; the processes waiting stop at once
ARCHIVE = ".sprite-archive.tar"  # where sbcast puts this node's copy of the archive (removed after unpacking)
HELD = "already claimed by this run"  # claim's word for a folder another process of this run made (shared)
WAIT_SECONDS = 900.0
CLAIM_GRACE_SECONDS = 10.0  # how long a folder without a marker may be one another process of this run just made


def claim(folder: str, token: str) -> bool:
    """Make ``folder`` with sprite's marker; True when this call made it, False when this run already holds it.

    Raises UsageError when the folder (or a symlink at its path) exists and is not this run's.
    """
    try:
        os.mkdir(folder, 0o700)
    except FileExistsError:
        owner = _owner_after_grace(folder)
        if owner == token:
            return False
        why = "holds another sprite run's stage" if owner else "exists and was not made by sprite"
        raise UsageError(f"--stage {folder}: the folder {why} on {socket.gethostname()}.",
                         "sprite stages into a folder it makes, and never writes into one it did not make.",
                         "Pass --stage with a folder that does not exist yet, or remove that one.") from None
    # The marker appears whole (written aside, then renamed into the folder this call made): a process of this
    # run that shares the folder never reads half of it.
    aside = os.path.join(folder, f"{MARKER}.{os.getpid()}.part")
    with open(aside, "x", encoding="utf-8") as out:
        json.dump({"token": token, "host": socket.gethostname(), "pid": os.getpid()}, out)
    os.rename(aside, os.path.join(folder, MARKER))
    return True


def _owner_after_grace(folder: str) -> str | None:
    """The marker's token; while a real folder of this user has none yet, wait up to CLAIM_GRACE_SECONDS for it:
    another process of this run (a second node sharing the folder) may have made the folder a moment ago and not
    yet written its marker. Two simulated nodes on one machine met that race in the suite."""
    deadline = time.monotonic() + CLAIM_GRACE_SECONDS
    while True:
        owner = marker_token(folder)
        if owner or time.monotonic() > deadline or not _own_real_folder(folder):
            return owner
        time.sleep(0.05)


def _own_real_folder(folder: str) -> bool:
    """Whether ``folder`` is a real folder (not a symlink to one) owned by this user."""
    try:
        return not os.path.islink(folder) and os.path.isdir(folder) and os.lstat(folder).st_uid == os.geteuid()
    except OSError:
        return False


def marker_token(folder: str) -> str | None:
    """The token in ``folder``'s marker if ``folder`` is a real folder of this user holding a real marker file."""
    if not _own_real_folder(folder):
        return None
    try:
        fd = os.open(os.path.join(folder, MARKER), os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, encoding="utf-8") as marker:
            return str(json.load(marker).get("token") or "") or None
    except (OSError, ValueError, AttributeError):
        return None


def unpack(folder: str, token: str, archive: str, sha256: str, drop_archive: bool = False) -> str:
    """Claim ``folder`` and unpack ``archive`` into it (or wait for this run's other unpacker); returns a line
    saying what happened. Raises UsageError (not this run's folder), UnsafeArchive, TimeoutError."""
    start = time.monotonic()
    ready = os.path.join(folder, READY)
    claim(folder, token)
    try:  # one unpacker per folder: the first process of this run to create the lock file
        os.close(os.open(os.path.join(folder, UNPACKING), os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600))
    except FileExistsError:
        return _wait_ready(ready, start)
    try:
        manifest, size = archmod.unpack(archive, folder, sha256)
        if drop_archive:
            os.unlink(archive)
        _interpreter(folder, manifest)
    except BaseException as err:  # the others of this run sharing the folder must not wait WAIT_SECONDS for it
        _mark_failed(folder, f"{type(err).__name__}: {err}"[:500])
        raise
    seconds = time.monotonic() - start
    with open(ready, "x", encoding="utf-8") as out:
        json.dump({"sha256": sha256, "seconds": round(seconds, 3), "bytes": size}, out)
    return f"unpacked {size / 1e6:.0f} MB in {seconds:.1f} s"


def _mark_failed(folder: str, error: str) -> None:
    """Leave the failure mark whole (written aside, then renamed in, as the marker is), or none where even that
    fails (a full disk): the others then wait out WAIT_SECONDS, as before."""
    aside = os.path.join(folder, f"{FAILED}.{os.getpid()}.part")
    try:
        with open(aside, "x", encoding="utf-8") as out:
            json.dump({"host": socket.gethostname(), "error": error}, out)
        os.rename(aside, os.path.join(folder, FAILED))
    except OSError:
        pass


def _wait_ready(ready: str, start: float) -> str:
    """Until the unpacker of this run sharing the folder marks it ready. Raises TimeoutError after WAIT_SECONDS,
    OSError at once when that unpacker failed (its FAILED mark)."""
    failed = os.path.join(os.path.dirname(ready), FAILED)
    while not os.path.exists(ready):
        if os.path.exists(failed):
            try:
                with open(failed, encoding="utf-8") as mark:
                    said = json.load(mark)
            except (OSError, ValueError):
                said = {}
            raise OSError(f"the process of this run that unpacked the shared folder on {said.get('host')} failed "
                          f"({said.get('error')})")
        if time.monotonic() - start > WAIT_SECONDS:
            raise TimeoutError(f"{ready} did not appear in {WAIT_SECONDS:.0f} s")
        time.sleep(0.2)
    return "already unpacked here by this run (a node sharing this machine's folder)"


def _interpreter(folder: str, manifest: dict) -> None:
    """For a staged venv: ``env/pyvenv.cfg`` whose home is the staged base (so the stdlib comes from the copy)
    and ``env/bin/pythonX.Y`` linking to the base interpreter binary, as ``python -m venv`` makes them."""
    if manifest.get("kind") != "venv":
        return
    version = manifest["version"]
    env = os.path.join(folder, "env")
    os.makedirs(os.path.join(env, "bin"), exist_ok=True)
    os.makedirs(os.path.join(folder, "base", "bin"), exist_ok=True)
    with open(os.path.join(env, "pyvenv.cfg"), "x", encoding="utf-8") as cfg:
        cfg.write(f"home = {os.path.join(folder, 'base', 'bin')}\n"
                  f"include-system-site-packages = {'true' if manifest.get('system_site') else 'false'}\n"
                  f"version = {version}\n")
    os.symlink(manifest["base_executable"], os.path.join(env, "bin", f"python{version}"))


def remove(folder: str, token: str) -> str:
    """Remove ``folder`` when its marker names ``token`` (rmtree never follows a symlink inside it)."""
    if not os.path.lexists(folder):
        return "nothing to remove"
    shared = "removed by another process of this run (a node sharing this machine's folder)"
    if marker_token(folder) != token:
        return shared if not os.path.lexists(folder) else f"left {folder} alone: it is not this run's stage"
    # One remover per folder: the rename is atomic, so of the processes of this run sharing the folder (two nodes
    # on one machine) one moves it aside and removes it, and the others find it gone; two rmtrees would race.
    aside = f"{folder}.removing-{secrets.token_hex(8)}"
    if os.path.lexists(aside):
        return f"left {folder} alone: {aside} exists"
    try:
        os.rename(folder, aside)
    except FileNotFoundError:
        return shared
    shutil.rmtree(aside)
    return "removed"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sprite.launch.stage.node")
    parser.add_argument("action", choices=("claim", "unpack", "remove"))
    parser.add_argument("--dir", required=True)
    parser.add_argument("--token", required=True)
    parser.add_argument("--archive")
    parser.add_argument("--sha256")
    parser.add_argument("--drop-archive", action="store_true")
    opts = parser.parse_args(argv)
    host = socket.gethostname()
    try:
        if opts.action == "claim":
            said = "claimed" if claim(opts.dir, opts.token) else HELD
        elif opts.action == "unpack":
            said = unpack(opts.dir, opts.token, opts.archive, opts.sha256, opts.drop_archive)
        else:
            said = remove(opts.dir, opts.token)
    except SpriteError as err:
        print(f"{report(err)} ({host})", file=sys.stderr, flush=True)
        return err.exit_code or EXIT_USAGE
    except (OSError, TimeoutError) as err:
        print(f"sprite-stage: {host}: {opts.action} {opts.dir} failed: {err}", file=sys.stderr, flush=True)
        return 1
    print(f"sprite-stage: {host}: {opts.dir}: {said}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
