"""The effects of ``--stage``: pack the environment into the shared cache (unless an archive with the same
fingerprint is there), broadcast and unpack it on every node, and remove the copies at the end."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import time

from sprite.errors import EXIT_USAGE, SpriteError, UsageError
from sprite.integrity import writeonce
from sprite.launch.stage import archive as archmod
from sprite.launch.stage import node, source
from sprite.launch.stage.plan import COPPER_VIEW, StagePlan


class StageFailed(SpriteError):
    """Packing, broadcasting or unpacking the environment failed (exit 1)."""


def stage(plan: StagePlan) -> dict:
    """Pack (or reuse) the archive and unpack it on every node; returns what happened, for the audit trail.

    Raises UsageError when the stage folder exists here and is not this run's, or the environment cannot be
    staged; StageFailed when a node step fails.
    """
    if os.path.lexists(plan.dir) and node.marker_token(plan.dir) != plan.token:
        node.claim(plan.dir, plan.token)  # raises the UsageError that names the folder, before any packing
    start = time.monotonic()
    env_source = source.current()
    files = source.walk(env_source)
    fingerprint = source.fingerprint(env_source, files)
    archive, sha, size, cached = cached_archive(plan.cache, env_source, files, fingerprint)
    packed = time.monotonic()
    broadcast, shared = plan.broadcast, False
    if broadcast == "sbcast":
        # A node that finds the folder already claimed by this run shares it with another node (one file system
        # behind both, as two slurmd on one machine have): sbcast to one path twice fails ("File exists"), so
        # the nodes read the cached archive instead, one unpacking and the others waiting for it (node.py).
        shared = node.HELD in _step(plan.node_argv("claim"), "claim the stage folder")
        broadcast = "read" if shared else broadcast
    if broadcast == "sbcast":
        copy = os.path.join(plan.dir, node.ARCHIVE)
        _step(["sbcast", archive, copy], "broadcast the archive with sbcast")
        _step(plan.node_argv("unpack", "--archive", copy, "--sha256", sha, "--drop-archive"), "unpack")
    else:
        where = archive
        if plan.broadcast == "copper":
            _step([plan.copper[0]], "start Copper")
            where = COPPER_VIEW.format(user=os.environ.get("USER", "")) + archive
        _step(plan.node_argv("unpack", "--archive", where, "--sha256", sha), "unpack")
    done = time.monotonic()
    return {"dir": plan.dir, "hosts": len(plan.hosts), "broadcast": broadcast, "shared_folder": shared,
            "archive": archive,
            "sha256": sha, "bytes": size, "files": len(files), "cached": cached, "shared": list(env_source.shared),
            "pack_seconds": round(packed - start, 3), "broadcast_seconds": round(done - packed, 3)}


def unstage(plan: StagePlan) -> None:
    """Remove the stage folder on every node (unless ``plan.keep``) and stop Copper if sprite started it.
    A failure is reported on stderr, never raised: the run's own outcome stands."""
    steps = [] if plan.keep else [(plan.node_argv("remove"), "remove the stage folders")]
    if plan.broadcast == "copper" and len(plan.copper) > 1:
        steps.append(([plan.copper[1]], "stop Copper"))
    for argv, what in steps:
        try:
            _step(argv, what, REMOVE_SECONDS)
        except SpriteError as err:
            print(f"sprite: {err}", file=sys.stderr, flush=True)


RECORD_WAIT = 60.0  # seconds to wait for the record of an archive another launch is packing


def cached_archive(cache: str, env_source, files: list, fingerprint: str) -> tuple[str, str, int, bool]:
    """(archive path, SHA-256, size, whether it was cached) of the environment with ``fingerprint``: packed into
    ``cache`` under a name of its own unless its record ``<archive>.json`` is there (or comes, from another launch
    packing the same environment at once). Raises UsageError for a cache folder or file others could have
    written (the ranks would run what it holds), StageFailed when packing fails or an archive has no record."""
    os.makedirs(cache, mode=0o700, exist_ok=True)
    _only_mine(cache, stat.S_ISDIR, "folder")
    archive = os.path.join(cache, f"sprite-env-{fingerprint[:32]}.tar")
    record = archive + ".json"
    known = _record(archive, record, RECORD_WAIT if os.path.lexists(archive) else 0.0)
    if known:
        return archive, known["sha256"], known["bytes"], True
    # The record seen first, then no archive: an orphan (a packer links the archive before its record). In the
    # other order a launch that linked both meanwhile would look like one.
    if os.path.lexists(record) and not os.path.lexists(archive):
        raise StageFailed(f"The stage cache holds the record {record} without its archive.",
                          "The archive was removed by hand, or the record is not sprite's.",
                          f"Remove {record} and launch again.")
    partial = f"{archive}.partial-{secrets.token_hex(8)}"  # a name no other launch on any host takes
    with writeonce.created(partial, 0o600) as fd:  # removed by created() if packing fails
        sha, size = archmod.pack(files, {**env_source.manifest(), "fingerprint": fingerprint}, fd)
    try:
        os.link(partial, archive)  # refuses an existing name: never over a file sprite did not write now
    except FileExistsError:  # another launch linked the same environment's archive while this one packed
        known = _record(archive, record, RECORD_WAIT)
        if not known:
            raise StageFailed(f"{archive} was removed while this launch packed its own.",
                              "Another launch or a person cleaned the stage cache meanwhile.",
                              "Launch again.") from None
        return archive, known["sha256"], known["bytes"], True
    finally:
        os.unlink(partial)
    # Whole or not at all: written aside, then linked in (a launch waiting for it never reads it half-written).
    aside = f"{record}.partial-{secrets.token_hex(8)}"
    writeonce.write_new(aside, json.dumps({"sha256": sha, "bytes": size, "fingerprint": fingerprint,
                                           "files": len(files)}).encode())
    try:
        os.link(aside, record)
    finally:
        os.unlink(aside)
    return archive, sha, size, False


def _only_mine(path: str, kind, what: str) -> None:
    """Raises UsageError unless ``path`` is a ``kind`` (not a symlink) owned by this user that no one else may
    write: an archive or record someone else put in the cache would be unpacked and run by the ranks."""
    info = os.lstat(path)
    if kind(info.st_mode) and info.st_uid == os.geteuid() and not info.st_mode & 0o022:
        return
    raise UsageError(f"--stage: the stage cache {what} {path} is not this user's alone (a symlink, another owner, or "
                     "writable by group or others).",
                     "The ranks run what the cache holds, so sprite takes it only from a folder no one else writes.",
                     "Set SPRITE_STAGE_CACHE to a folder of your own with mode 0700, or fix its owner and mode.")


def _record(archive: str, record: str, wait: float) -> dict | None:
    """The record of ``archive`` when both are there (waiting up to ``wait`` seconds for a record another launch
    is writing); None when there is no archive. Raises StageFailed for an archive that stays without its record,
    UsageError for either not being this user's own file."""
    deadline = time.monotonic() + wait
    while True:
        if not os.path.lexists(archive):
            return None
        if os.path.lexists(record):
            _only_mine(archive, stat.S_ISREG, "file")
            _only_mine(record, stat.S_ISREG, "file")
            try:
                with open(record, encoding="utf-8") as meta:
                    known = json.load(meta)
                return {"sha256": str(known["sha256"]), "bytes": int(known["bytes"])}
            except (ValueError, KeyError, TypeError) as err:  # an older sprite writing it in place: wait
                problem = f"The stage cache's record {record} cannot be read ({type(err).__name__})."
        else:
            problem = f"The stage cache holds {archive} without its record {os.path.basename(record)}."
        if time.monotonic() >= deadline:
            raise StageFailed(problem, "An earlier launch stopped while packing, or the file is not sprite's.",
                              f"Remove {archive} and {os.path.basename(record)} if there, then launch again.")
        time.sleep(0.5)


STEP_SECONDS = 1800.0  # a stage step still running after this is stopped: a node that hangs must not hang the run
REMOVE_SECONDS = 300.0  # the same for removing the copies at the end (seconds on a healthy node)


class _Signalled(BaseException):
    """A SIGTERM or SIGHUP arrived while a stage step ran."""


def _raise_on(signals: tuple, caught: list) -> dict:
    """Make each of ``signals`` raise _Signalled (noting it in ``caught``) where the default would end the process;
    returns the handlers to put back. Nothing changes outside the main thread or where the signal is handled
    already (sprite run's own forwarding)."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return {}

    def stop(sig, _frame):
        caught.append(sig)
        raise _Signalled(sig)

    previous = {}
    for sig in signals:
        if signal.getsignal(sig) is signal.SIG_DFL:
            previous[sig] = signal.signal(sig, stop)
    return previous


def _step(argv: list[str], what: str, seconds: float | None = None) -> str:
    """Run one stage step with this environment (PYTHONSAFEPATH: the node tool imports the installed sprite), in
    a session of its own, stopped with everything it started after ``seconds`` (STEP_SECONDS); its output goes to
    stderr, and its standard output is returned too. Raises UsageError when a node refused the folder (exit 2),
    StageFailed otherwise."""
    from sprite.launch import procgroup

    search = os.pathsep.join([os.environ.get("PATH", ""), os.path.dirname(sys.executable)])
    program = shutil.which(argv[0], path=search)
    if not program:
        raise StageFailed(f"--stage: {argv[0]} is not on PATH, so sprite cannot {what}.",
                          "The batch system's or the site's tool is not loaded here.",
                          "Load its module, or drop --stage.")
    limit = STEP_SECONDS if seconds is None else seconds
    proc = subprocess.Popen([program, *argv[1:]], env={**os.environ, "PYTHONSAFEPATH": "1"}, stdout=subprocess.PIPE,
                            stderr=sys.stderr, stdin=subprocess.DEVNULL, text=True, errors="replace",
                            start_new_session=True)
    # In a session of its own the step no longer shares sprite's fate: a SIGTERM or SIGHUP that ends sprite ends
    # the step first (the handlers raise here, the finally below stops it, then sprite dies of the signal).
    caught: list[int] = []
    previous = _raise_on((signal.SIGTERM, signal.SIGHUP), caught)
    try:
        out, _ = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        procgroup.stop_groups([proc])
        raise StageFailed(f"--stage: could not {what}: the step was still running after {limit:.0f} s.",
                          "A node did not answer (down or hung), or its file system stalled.",
                          "Leave that node out (--exclude, or --preflight to find it) and launch again.") from None
    finally:
        if proc.poll() is None:
            procgroup.stop_groups([proc])
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if caught:
            os.kill(os.getpid(), caught[0])  # the signal's own effect, now that the step is stopped
    done = subprocess.CompletedProcess(proc.args, proc.returncode, out, None)
    sys.stderr.write(done.stdout)
    sys.stderr.flush()
    if done.returncode == EXIT_USAGE:
        raise UsageError(f"--stage: a node refused the stage folder ({what} exited {EXIT_USAGE}).",
                         "The folder exists there and was not made by this run (its line above names it).",
                         "Pass --stage with a folder that does not exist yet, or remove that one.")
    if done.returncode:
        raise StageFailed(f"--stage: could not {what} (exit {done.returncode}).", "The node's line above says why.",
                          "Fix that and launch again; the archive stays cached.")
    return done.stdout
