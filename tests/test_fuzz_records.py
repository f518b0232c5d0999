"""Property-based fuzzing of the records sprite reads back (issue 32): manifests, checkpoint metadata, audit trails,
run.json and heartbeat files, as sprite writes them and then as a user or an attacker with write access to the
folder leaves them: fields of any type, bytes edited, a trail re-chained (its hashes are unkeyed), a record
replaced by a FIFO, a symlink, a folder, a sparse file of gigabytes or JSON nested 100,000 deep, a pickle that
names code, a symlink or a deep folder chain inside a checkpoint.

For every case: no exception but sprite's own (an error printed as one line), no hang (every read runs under a
SIGALRM deadline, every command under a timeout), no code run from a pickle, and a checkpoint found valid only if
its manifest lists regular files inside it alone. Budgets come from the hypothesis profile (tests/conftest.py:
"ci" by default, "deep" for long local runs: HYPOTHESIS_PROFILE=deep pytest tests/test_fuzz_records.py).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import math
import os
import pickle
import resource
import signal
import socket
import subprocess
import tempfile
from itertools import count
from pathlib import Path

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from sprite import integrity
from sprite.cli import runs as runs_cli
from sprite.contract import heartbeat
from sprite.errors import SpriteError, report
from sprite.integrity import audit, canonical, dcp_metadata
from sprite.integrity import scan as ckpt_scan
from sprite.recovery import rundir, watchdog

from conftest import OUTSIDE_CHECKOUT, remove_tree

BUDGET = settings().max_examples  # the loaded profile's; each test takes a share of it
WORK = Path(tempfile.mkdtemp(prefix="sprite-fuzz-records-"))
NAMES = count()
MARKER = WORK / "code-ran"  # a crafted pickle creates it: it must never exist
DEEP = b"[" * 100_000 + b"]" * 100_000
HOSTILE = [None, True, False, -1, 0, 1, 7, 2 ** 63, 10 ** 30, 1e30, -0.0, 0.5, "", "x", "1", "7", "../x",
           "/etc/hostname", "a\nb", "\x1b[31m", "é", "x" * 300, [], {}, [1], {"a": 1}, ["a", "b"], "0" * 64]
SCALARS = st.sampled_from(HOSTILE) | st.integers() | st.text(max_size=8) | st.floats(allow_nan=False,
                                                                                      allow_infinity=False)
VALUES = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6),
                                                                                           inner, max_size=3),
                      max_leaves=6)
STATUSES = {"succeeded", "stalled", "preempted", "interrupted", "failed", "incomplete", "damaged", "unknown"}


class Hang(BaseException):
    """Raised by SIGALRM inside a read that did not return in time (a BaseException: nothing swallows it)."""


@contextlib.contextmanager
def deadline(seconds: float = 20.0):
    def ring(_signum, _frame):
        raise Hang(f"no answer within {seconds} s")

    previous = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class Crafted:
    def __reduce__(self):
        return os.mkdir, (str(MARKER),)


def fresh(prefix: str) -> Path:
    path = WORK / f"{prefix}{next(NAMES)}"
    path.mkdir()
    return path


def special(draw, path: Path) -> str:
    """Replace ``path`` (if any) by a FIFO, a symlink, a folder, a sparse file over every bound or deep JSON."""
    how = draw(st.sampled_from(["fifo", "symlink", "dangling", "folder", "sparse", "deep"]))
    if os.path.lexists(path):
        if path.is_dir() and not path.is_symlink():
            os.rmdir(path)
        else:
            os.unlink(path)
    if how == "fifo":
        os.mkfifo(path)
    elif how == "symlink":
        os.symlink("/etc/hostname", path)
    elif how == "dangling":
        os.symlink(WORK / "nowhere", path)
    elif how == "folder":
        path.mkdir()
    elif how == "sparse":
        with open(path, "wb") as out:
            out.truncate(300 << 20)  # over MANIFEST_MAX, SUMMARY_MAX and AUDIT_MAX
    else:
        path.write_bytes(DEEP)
    return how


def edit_bytes(draw, path: Path) -> None:
    """One raw edit of a file: a flipped byte, a cut, bytes inserted, or the whole replaced."""
    data = path.read_bytes()
    how = draw(st.sampled_from(["flip", "cut", "insert", "replace"]))
    at = draw(st.integers(0, max(0, len(data) - 1)))
    if how == "flip" and data:
        data = data[:at] + bytes([data[at] ^ (1 << draw(st.integers(0, 7)))]) + data[at + 1:]
    elif how == "cut":
        data = data[:at]
    elif how == "insert":
        data = data[:at] + draw(st.binary(min_size=1, max_size=8) | st.sampled_from([b"\n", b"{", b"]"])) + data[at:]
    else:
        data = draw(st.binary(max_size=40) | VALUES.map(lambda v: json.dumps(v).encode()))
    path.unlink()
    path.write_bytes(data)


# Manifests

UNSAFE = ["../x", "/etc/hostname", "", ".", "a//b", "./a", "a/", "lnk/hostname", "sub/../a", integrity.MANIFEST_NAME,
          "a\nb", "é"]


def metadata_bytes(draw) -> bytes:
    return draw(st.sampled_from([pickle.dumps({"a": [1, 2]}), pickle.dumps(Crafted()), b"not a pickle",
                                 pickle.dumps(Path("x"))]))


@st.composite
def checkpoints(draw) -> tuple[Path, Path]:
    """``(folder, target)``: a checkpoint sprite sealed, then maybe forged, edited or replaced in part."""
    case = fresh("c")
    if draw(st.booleans()):
        target = case / "one.ckpt"
        target.write_bytes(draw(st.binary(max_size=64)))
    else:
        target = case / "ckpt"
        target.mkdir()
        names = draw(st.lists(st.sampled_from(["a", "sub/b", ".metadata", "__0_0.distcp"]), min_size=1, unique=True))
        for name in names:
            (target / name).parent.mkdir(exist_ok=True)
            (target / name).write_bytes(metadata_bytes(draw) if name == ".metadata" else draw(st.binary(max_size=64)))
    integrity.seal(target, {"step": draw(st.integers(0, 9)), "epoch": 0})
    attack = draw(st.sampled_from(["tree", "reseal", "special", "bytes", "none", "tree", "reseal"]))
    event(f"manifest: {attack}")
    manifest = integrity.manifest_path(target)
    if attack == "reseal":
        body = json.loads(manifest.read_bytes())
        body.pop(canonical.SELF)
        for _ in range(draw(st.integers(1, 3))):
            forge(draw, body)
        manifest.unlink()
        manifest.write_bytes(canonical.sealed(body))
    elif attack == "bytes":
        edit_bytes(draw, manifest)
    elif attack == "special":
        event(f"manifest: {special(draw, manifest)}")
    elif attack == "tree":
        change_tree(draw, case, target)
    return case, target


def forge(draw, body: dict) -> None:
    """One change an attacker makes to a manifest body before sealing it again."""
    files = body.get("files") if isinstance(body.get("files"), dict) else {}
    where = draw(st.sampled_from(["top", "files", "entry", "add"]))
    if where == "top":
        body[draw(st.sampled_from(["kind", "name", "meta", "files", "sprite_manifest"]) | st.text(max_size=4))] = \
            draw(VALUES)
    elif where == "files":
        body["files"] = draw(st.sampled_from([{}, [], None, "x"]) | VALUES)
    elif where == "entry" and files:
        rel = draw(st.sampled_from(sorted(files)))
        entry = files[rel]
        if isinstance(entry, dict) and draw(st.booleans()):
            entry[draw(st.sampled_from(["size", "sha256", "chunk_bytes", "sha256_chunks"]))] = draw(VALUES)
        else:
            files[rel] = draw(VALUES)
    else:
        hostname = integrity.describe(Path("/etc"), ["hostname"])["hostname"]
        files[draw(st.sampled_from(UNSAFE))] = draw(st.sampled_from([hostname, {"size": 0, "sha256": "0" * 64}]))
        body["files"] = files


def change_tree(draw, case: Path, target: Path) -> None:
    """What else can be done to the folder: symlinks, a deep chain, a FIFO in place of a file, a crafted
    .metadata sealed again."""
    root = target if target.is_dir() else case
    how = draw(st.sampled_from(["symlink", "deep", "fifo", "crafted", "extra"]))
    event(f"tree: {how}")
    if how == "symlink":
        os.symlink("/etc", root / "lnk")
        if target.is_dir() and draw(st.booleans()):  # listed too, as the attacker re-seals it
            reseal(target, {"lnk/hostname": integrity.describe(Path("/etc"), ["hostname"])["hostname"]})
    elif how == "deep":
        deep = root
        for _ in range(draw(st.sampled_from([2, 300, 1100]))):
            deep = deep / "d"
            os.mkdir(deep)
        (deep / "f").write_bytes(b"x")
    elif how == "fifo":
        victim = next((p for p in sorted(root.rglob("*")) if p.is_file() and not p.name.endswith(".json")), None)
        if victim is not None:
            victim.unlink()
            os.mkfifo(victim)
    elif how == "crafted" and target.is_dir():
        metadata = target / ".metadata"
        if metadata.exists():
            metadata.unlink()
        metadata.write_bytes(pickle.dumps(Crafted()))
        reseal(target, {})
    else:
        (root / "extra").write_bytes(b"x")


def reseal(target: Path, extra: dict) -> None:
    """Seal ``target`` again as an attacker would: its manifest rewritten over what the folder holds now."""
    manifest = integrity.manifest_path(target)
    body = json.loads(manifest.read_bytes())
    body.pop(canonical.SELF)
    files = {name: entry for name, entry in integrity.describe(target, [
        name for name in body["files"] if (target / name).is_file()]).items()}
    body["files"] = {**files, **extra}
    manifest.unlink()
    manifest.write_bytes(canonical.sealed(body))


def assert_sound(target: Path, verdict: integrity.Verdict) -> None:
    """A valid verdict: the manifest lists regular files inside ``target`` only, through no symlink, each of
    its recorded size and digest; a folder's .metadata holds torch's metadata classes only."""
    assert isinstance(verdict.reason, str)
    if not verdict.valid:
        event("manifest refused")
        return
    event("manifest valid")
    body = verdict.manifest
    root = target if body["kind"] == "dir" else target.parent
    if body["kind"] == "file":
        assert set(body["files"]) == {target.name}, body["files"]
    real = os.path.realpath(root)
    for rel, entry in body["files"].items():
        path = root / rel
        assert os.path.realpath(path).startswith(real + os.sep) and not path.is_symlink(), rel
        assert path.is_file() and path.stat().st_size == entry["size"], rel
    if (root / ".metadata").exists() and body["kind"] == "dir":
        assert dcp_metadata.check((root / ".metadata").read_bytes()) == ""


@settings(max_examples=BUDGET // 3)
@given(checkpoints())
def test_manifests_verify_or_refuse_and_never_hang_or_run_code(case):
    folder, target = case
    with deadline():
        verdict = integrity.verify(target)
        entry = ckpt_scan.inspect(target)
        entries, found = ckpt_scan.listed([folder])
        chosen, skipped, _ = ckpt_scan.choose([folder])
    assert_sound(target, verdict)
    assert entry.valid == verdict.valid and found >= 1 and len(entries) == found
    assert chosen is None or chosen.path == target and verdict.valid
    assert all("\n" not in report(integrity.IntegrityError(e.reason)) for e in skipped)
    json.dumps([e.to_json() for e in entries])
    assert not MARKER.exists()


# The .metadata pickle

DANGEROUS = [("posix", "system"), ("os", "system"), ("builtins", "eval"), ("builtins", "getattr"),
             ("builtins", "__import__"), ("subprocess", "Popen"), ("torch", "load"), ("pickle", "loads"),
             ("torch.distributed.checkpoint.metadata", "Metadata"), ("torch", "Size"), ("torch", "float32"),
             ("torch.serialization", "_get_layout"), ("pathlib", "PosixPath"), ("copyreg", "_reconstructor"),
             ("torch.distributed.checkpoint.filesystem", "_StorageInfo"), ("collections", "OrderedDict")]


@st.composite
def pickles(draw) -> bytes:
    """A pickle program calling one name (allowed or not) with drawn arguments, or real metadata edited."""
    if draw(st.booleans()):
        module, name = draw(st.sampled_from(DANGEROUS))
        args = pickle.dumps(tuple(draw(st.lists(st.sampled_from([f"mkdir {MARKER}", str(MARKER), 1, (2, 3), None]),
                                                 max_size=2))), protocol=2)[2:-1]  # the tuple's opcodes
        return b"\x80\x02c" + module.encode() + b"\n" + name.encode() + b"\n" + args + b"R."
    data = bytearray(real_metadata())
    for _ in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, len(data) - 1))
        data[at] = draw(st.integers(0, 255))
    return bytes(data)


@functools.cache
def real_metadata() -> bytes:
    """torch's own .metadata for a small state (written once per session)."""
    import warnings

    import torch
    import torch.distributed.checkpoint as dcp

    folder = fresh("real")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"w": torch.zeros(2, 3), "b": torch.zeros(1, dtype=torch.bfloat16), "n": 3}, checkpoint_id=folder,
                 no_dist=True)
    return (folder / ".metadata").read_bytes()


@settings(max_examples=BUDGET // 16)
@given(pickles())
def test_a_metadata_pickle_is_read_with_torchs_classes_or_refused(data):
    from sprite.runtime.ckpt import dcp_read

    path = fresh("m") / ".metadata"
    path.write_bytes(data)
    with deadline():
        problem = dcp_metadata.check(data)
        try:
            found = dcp_read.read_metadata(path)
        except integrity.IntegrityError as err:
            assert "\n" not in report(err)
            event("metadata refused")
            found = None
    assert not MARKER.exists()
    assert (found is None) or not problem  # the torch-free check never lets through what the reader refuses
    event("metadata read" if found is not None else "metadata refused")


# Audit trails and run.json

KINDS = ["launch", "attempt_start", "attempt_end", "resume", "stall", "completion", "checkpoint_written"]
FIELDS = ["run_dir", "script", "status", "exit_code", "attempt", "cause", "reason", "hosts", "seconds",
          "node_hours", "device_hours", "path", "step"]


@st.composite
def runs(draw) -> Path:
    """A run folder with a trail sprite appended (any field values), then maybe edited, re-chained with records
    of any shape, or replaced; and a run.json of any shape."""
    run = rundir.create(fresh("r") / "run")
    trail = run / rundir.AUDIT
    records = draw(st.lists(st.tuples(st.sampled_from(KINDS) | st.text(max_size=4),
                                      st.dictionaries(st.sampled_from(FIELDS), VALUES, max_size=4)), max_size=5))
    last = None
    for kind, fields in records:
        last = audit.append(trail, kind, **fields)
    attack = draw(st.sampled_from(["none", "bytes", "rechain", "rechain", "special"]))
    event(f"trail: {attack}")
    if attack == "bytes" and os.path.lexists(trail) and trail.stat().st_size:
        edit_bytes(draw, trail)
    elif attack == "rechain":
        forged = draw(st.lists(st.dictionaries(st.sampled_from([*FIELDS, "kind", "time"]) | st.text(max_size=3),
                                               VALUES, max_size=5), min_size=1, max_size=5))
        last = rechain(trail, forged)
    elif attack == "special":
        special(draw, trail)
    summary_file(draw, run, last)
    return run


def rechain(trail: Path, forged: list[dict]) -> dict:
    """A trail of ``forged`` records whose chain verifies: prev and seq right, everything else as drawn."""
    lines, prev, record = [], audit.GENESIS, {}
    for seq, fields in enumerate(forged):
        record = {**fields, "seq": seq, "prev": prev}
        line = canonical.sealed(record, one_line=True)
        lines.append(line)
        prev = hashlib.sha256(line).hexdigest()
    if os.path.lexists(trail):
        trail.unlink()
    trail.write_bytes(b"".join(line + b"\n" for line in lines))
    return {**record, canonical.SELF: canonical.digest(record)}


def summary_file(draw, run: Path, last) -> None:
    path = run / rundir.SUMMARY
    how = draw(st.sampled_from(["none", "sprite", "shape", "bytes", "special"]))
    if how == "sprite":
        tail = last[canonical.SELF] if last and draw(st.booleans()) else draw(VALUES)
        rundir.write_summary(run, {"audit_tail": tail, "host": draw(st.sampled_from([socket.gethostname(), "x", 5])),
                                   "pid": draw(st.sampled_from([-1, 0, True, 10 ** 30, 1e30, 2 ** 31, "1", None]))})
    elif how == "shape":
        path.write_text(json.dumps(draw(VALUES)))
    elif how == "bytes":
        path.write_bytes(draw(st.binary(max_size=30)))
    elif how == "special":
        special(draw, path)


def _number_or_none(value) -> bool:
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value))


@settings(max_examples=BUDGET // 4)
@given(runs())
def test_runs_are_summarized_or_refused_in_one_line(run):
    with deadline():
        intact, reason = audit.verify(run / rundir.AUDIT)
        row = runs_cli.describe(run)
        rows = runs_cli.list_runs(run.parent)
        try:
            verdict = runs_cli.verify(run)
        except SpriteError as err:
            assert err.exit_code in (1, 2) and "\n" not in report(err)
            verdict = None
    assert isinstance(intact, bool) and isinstance(reason, str)
    assert row["status"] in STATUSES, row["status"]  # never "running": no pid drawn is alive
    assert _number_or_none(row["device_hours"]) and _number_or_none(row["node_hours"])
    assert isinstance(row["started"], str) and (row["attempts"] is None or isinstance(row["attempts"], int))
    json.dumps(rows, allow_nan=False)
    runs_cli._table(rows)
    assert verdict is None or intact
    event(f"run: {row['status']}")


# Heartbeat files

GOOD_BEAT = {"rank": 0, "host": "h", "pid": 7, "step": 5, "phase": heartbeat.TRAINING, "count": 3, "time": 1.0}


@st.composite
def beat_folders(draw) -> tuple[Path, set[int]]:
    """A heartbeat folder: good beats, beats with hostile fields, raw bytes, special files; and the ranks whose
    beats were left good."""
    folder, good = fresh("h"), set()
    for rank in range(draw(st.integers(1, 5))):
        path = folder / f"rank{rank}.json"
        how = draw(st.sampled_from(["good", "field", "field", "bytes", "special"]))
        fields = {**GOOD_BEAT, "rank": rank, "step": draw(st.integers(0, 99))}
        if how == "good":
            good.add(rank)
        elif how == "field":
            for _ in range(draw(st.integers(1, 3))):
                fields[draw(st.sampled_from([*GOOD_BEAT, "first_step"]) | st.text(max_size=3))] = draw(
                    VALUES | st.sampled_from([math.nan, math.inf, -math.inf]))
        if how in ("good", "field"):
            path.write_text(json.dumps(fields))
        elif how == "bytes":
            path.write_bytes(draw(st.binary(max_size=40)))
        else:
            special(draw, path)
    return folder, good


@settings(max_examples=BUDGET // 2)
@given(beat_folders())
def test_bad_heartbeats_are_skipped_and_the_watchdog_goes_on(case):
    folder, good = case
    with deadline():
        beats = heartbeat.read_all(folder)
    assert good <= set(beats)
    for rank, beat in beats.items():
        assert rank == beat.rank >= 0 and all(type(getattr(beat, key)) is int for key in (
            "rank", "pid", "step", "count", "first_step"))
        assert isinstance(beat.host, str) and isinstance(beat.phase, str) and not math.isnan(beat.time)
    watch = watchdog.Watch(watchdog.Limits.from_options(1.0), 4, 0.0)
    watch.observe(beats, 1.0)
    watch.observe(beats, 10_000.0)
    watchdog.summarize(beats, 4)
    watchdog.suspects(beats, 4)
    event(f"beats kept: {len(beats)}")


# The commands themselves

def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))


def _command(sprite_cmd, *args) -> subprocess.CompletedProcess:
    done = subprocess.run([*sprite_cmd, *map(str, args)], capture_output=True, text=True, timeout=60,
                          cwd=OUTSIDE_CHECKOUT, preexec_fn=_limit_memory)
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) <= 1, done.stderr[-3000:]
    return done


@pytest.mark.slow
@settings(max_examples=max(2, BUDGET // 160))
@given(checkpoints(), runs())
def test_the_commands_answer_in_one_line_under_a_memory_limit(sprite_cmd, checkpoint, run):
    folder, target = checkpoint
    assert _command(sprite_cmd, "ckpt", "verify", target).returncode in (0, 1)
    assert _command(sprite_cmd, "ckpt", "list", folder, "--json").returncode == 0
    assert _command(sprite_cmd, "runs", run.parent).returncode == 0
    assert _command(sprite_cmd, "runs", "verify", run).returncode in (0, 1, 2)
    assert not MARKER.exists()


@pytest.fixture(scope="module", autouse=True)
def _remove_work_folder():
    """The cases live in one folder outside pytest's: remove it (deep chains included) when the module ends."""
    yield
    remove_tree(WORK)
