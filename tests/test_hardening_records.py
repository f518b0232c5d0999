"""Issue 32, second pass: sprite's own records (manifests, checkpoint metadata, audit trails, run.json, heartbeat
files, bench.json) read as a user or an attacker with write access to the folder leaves them.

Each test forges what the issue names and checks what the user sees: a refusal on one line with the right exit
code, no code run from a pickle, no hang on a FIFO, no file read outside the folder, nothing of theirs changed.
"""

from __future__ import annotations

import json
import os
import pickle
import resource
import subprocess
import threading
from pathlib import Path

import pytest

from sprite import integrity
from sprite.contract import heartbeat
from sprite.integrity import audit, canonical
from sprite.integrity import scan as ckpt_scan
from sprite.recovery import rundir, watchdog

from conftest import OUTSIDE_CHECKOUT, remove_tree

DEEP = b"[" * 100_000 + b"]" * 100_000


def sprite(sprite_cmd, *args, cwd=None, memory: int | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    """The real CLI, bounded in time (and address space when ``memory`` is given)."""
    limit = (lambda: resource.setrlimit(resource.RLIMIT_AS, (memory, memory))) if memory else None
    return subprocess.run([*sprite_cmd, *map(str, args)], capture_output=True, text=True, timeout=timeout,
                          cwd=cwd or OUTSIDE_CHECKOUT, preexec_fn=limit)


def refused(done: subprocess.CompletedProcess, code: int) -> str:
    """The one printed line of a refusal with exit ``code``."""
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    lines = done.stderr.strip().splitlines()
    assert done.returncode == code and len(lines) == 1 and lines[0].startswith("sprite: error: "), \
        (done.returncode, done.stderr[-3000:])
    return lines[0]


class Crafted:
    """Unpickling it creates the folder ``marker``: the proof that code ran."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return os.mkdir, (self.marker,)


def _sealed_folder(root: Path, metadata: bytes | None = None) -> Path:
    folder = root / "ckpt"
    integrity.make_dir_new(folder)
    integrity.write_new(folder / "__0_0.distcp", b"shard" * 20)
    if metadata is not None:
        integrity.write_new(folder / ".metadata", metadata)
    integrity.seal(folder, {"step": 3, "epoch": 0})
    return folder


def _real_metadata(folder: Path) -> Path:
    """A torch.distributed.checkpoint folder written by torch itself (plus Lightning's meta.pt)."""
    import warnings

    import torch
    import torch.distributed.checkpoint as dcp

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4))
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    state = {"state_dict": model.state_dict(), "optimizer_0": optimizer.state_dict(),
             "bf16": torch.zeros(3, dtype=torch.bfloat16), "cl": torch.zeros(1, 2, 2, 2).to(
                 memory_format=torch.channels_last), "i8": torch.zeros(2, dtype=torch.int8)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(state, checkpoint_id=folder, no_dist=True)
    torch.save({"epoch": 0, "global_step": 3}, folder / "meta.pt")
    return folder


# 1. Pickles from a checkpoint folder run code

def test_consolidate_refuses_a_crafted_metadata_before_any_code_runs(sprite_cmd, tmp_path):
    source = tmp_path / "ckpt"
    source.mkdir()
    marker = tmp_path / "pwned"
    (source / ".metadata").write_bytes(pickle.dumps(Crafted(marker)))
    (source / "meta.pt").write_bytes(b"x")
    line = refused(sprite(sprite_cmd, "ckpt", "consolidate", source, tmp_path / "out.ckpt"), 2)
    assert not marker.exists() and "posix.mkdir" in line and not (tmp_path / "out.ckpt").exists()


def test_a_resealed_crafted_metadata_is_invalid_and_never_unpickled(sprite_cmd, tmp_path):
    marker = tmp_path / "pwned"
    folder = _sealed_folder(tmp_path, pickle.dumps(Crafted(marker)))  # replaced, then sealed again: it verifies
    line = refused(sprite(sprite_cmd, "ckpt", "verify", folder), 1)
    assert ".metadata" in line and "posix.mkdir" in line
    chosen, skipped, found = ckpt_scan.choose([tmp_path])  # what --resume auto's rank 0 runs first
    assert chosen is None and found == 1 and "posix.mkdir" in skipped[0].reason and not marker.exists()


@pytest.mark.slow
def test_a_resealed_crafted_checkpoint_never_runs_its_pickle_under_resume_whatever_torch_is_told(sprite_cmd,
                                                                                                tmp_path):
    """A manifest is an unkeyed hash: someone who can write the checkpoint folder can seal a crafted pickle. Under
    --resume sprite loads it with weights_only=True given outright, which TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1
    cannot turn off (it did: the pickle ran), and a script's fit(weights_only=False) is refused in one line."""
    from conftest import sprite_free_env

    marker = tmp_path / "pwned"
    evil = tmp_path / "ck" / "epoch=9-step=999.ckpt"
    evil.parent.mkdir()
    integrity.write_new(evil, pickle.dumps({"state_dict": Crafted(marker)}))
    integrity.seal(evil, {"step": 999, "epoch": 9})
    example = (Path(__file__).resolve().parents[1] / "examples" / "train.py").read_text()
    call = "trainer.fit(model, DataLoader(make_data(), batch_size=args.batch_size))"
    assert call in example
    plain, asking = tmp_path / "train.py", tmp_path / "train_unsafe.py"
    plain.write_text(example)
    asking.write_text(example.replace(call, call[:-1] + ", weights_only=False)"))

    def resume(script, **env):
        return subprocess.run([*sprite_cmd, "run", "--devices", "1", "--accelerator", "cpu", "--resume", str(evil),
                               str(script), "--max-steps", "2"], capture_output=True, text=True, timeout=300,
                              cwd=tmp_path, env={**sprite_free_env(), **env})

    forced = resume(plain, TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD="1")
    assert forced.returncode != 0 and not marker.exists(), forced.stderr[-3000:]
    assert "Weights only load failed" in forced.stderr, forced.stderr[-3000:]
    unsafe = resume(asking)
    assert unsafe.returncode == 2 and not marker.exists(), unsafe.stderr[-3000:]
    said = [line for line in unsafe.stderr.splitlines() if "sprite: error:" in line]
    assert said and "Trainer.fit(weights_only=False)" in said[0] and "add_safe_globals" in said[0], said


def test_sprites_reader_unpickles_torchs_metadata_and_refuses_a_crafted_one(tmp_path):
    import torch.distributed.checkpoint as dcp

    from sprite.runtime.ckpt import dcp_read

    folder = _real_metadata(tmp_path / "real")
    ours, torchs = dcp_read.Reader(folder).read_metadata(), dcp.FileSystemReader(folder).read_metadata()
    assert ours.state_dict_metadata == torchs.state_dict_metadata and ours.storage_data == torchs.storage_data
    integrity.seal(folder, {"step": 3})
    assert integrity.verify(folder).valid  # torch's own metadata passes the check
    crafted = tmp_path / "crafted"
    crafted.mkdir()
    (crafted / ".metadata").write_bytes(pickle.dumps({"x": Crafted(tmp_path / "pwned")}))
    with pytest.raises(integrity.IntegrityError, match="posix.mkdir"):
        dcp_read.Reader(crafted).read_metadata()
    assert not (tmp_path / "pwned").exists()


# 2. A manifest describes its own target and nothing outside it

def _forge(target: Path, files: dict, kind: str | None = None) -> None:
    path = integrity.manifest_path(target)
    if path.exists():
        path.unlink()
    body = {"sprite_manifest": 1, "kind": kind or ("dir" if target.is_dir() else "file"), "name": target.name,
            "meta": {"step": 1}, "files": files}
    path.write_bytes(canonical.sealed(body))


def test_a_forged_manifest_listing_nothing_or_outside_the_folder_is_invalid(tmp_path):
    ckpt = tmp_path / "one.ckpt"
    ckpt.write_bytes(b"weights")
    _forge(ckpt, {})
    assert not integrity.verify(ckpt).valid
    os.symlink("/etc", tmp_path / "lnk")
    hostname = integrity.describe(Path("/etc"), ["hostname"])["hostname"]
    _forge(ckpt, {"lnk/hostname": hostname})
    verdict = integrity.verify(ckpt)
    assert not verdict.valid and "lists other files than one.ckpt" in verdict.reason
    folder = tmp_path / "dir"
    folder.mkdir()
    _forge(folder, {})
    assert not integrity.verify(folder).valid
    os.symlink("/etc", folder / "lnk")
    _forge(folder, {"lnk/hostname": hostname})
    verdict = integrity.verify(folder)
    assert not verdict.valid and "lnk (on the way to lnk/hostname) is not a folder" in verdict.reason


def test_consolidate_never_writes_into_a_sealed_checkpoint(sprite_cmd, tmp_path):
    source = _real_metadata(tmp_path / "ckpt")
    integrity.seal(source, {"step": 3})
    line = refused(sprite(sprite_cmd, "ckpt", "consolidate", source, source / "one.ckpt"), 2)
    assert "sealed" in line and not (source / "one.ckpt").exists() and integrity.verify(source).valid


# 3. Special files and sizes

def _finishes(call, fifo: Path, seconds: float = 20.0):
    """``call()``'s result; fails (and unblocks the reader) when it does not return in time."""
    box: list = []
    thread = threading.Thread(target=lambda: box.append(call()), daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # the blocked reader gets end of file
        thread.join(5)
        pytest.fail(f"blocked on the FIFO {fifo}")
    return box[0]


def test_a_fifo_manifest_blocks_nothing(sprite_cmd, tmp_path):
    ckpt = tmp_path / "one.ckpt"
    ckpt.write_bytes(b"weights")
    os.mkfifo(integrity.manifest_path(ckpt))
    assert "regular" in refused(sprite(sprite_cmd, "ckpt", "verify", ckpt, timeout=30), 1)
    listing = sprite(sprite_cmd, "ckpt", "list", tmp_path, "--json", timeout=30)
    assert listing.returncode == 0 and json.loads(listing.stdout)[0]["valid"] is False
    entries, found = _finishes(lambda: ckpt_scan.listed([tmp_path]), integrity.manifest_path(ckpt))
    assert found == 1 and entries[0].valid is False  # --resume auto's rank 0


def _run(tmp_path: Path) -> Path:
    run = rundir.create(tmp_path / "runs" / "r1")
    done = audit.append(run / rundir.AUDIT, "launch", run_dir=str(run), script="t.py")
    rundir.write_summary(run, {"audit_tail": done["self_sha256"], "host": os.uname().nodename})
    return run


def test_a_fifo_run_json_or_heartbeat_blocks_nothing(sprite_cmd, tmp_path):
    run = _run(tmp_path)
    (run / rundir.SUMMARY).unlink()
    os.mkfifo(run / rundir.SUMMARY)
    listing = sprite(sprite_cmd, "runs", tmp_path / "runs", "--json", timeout=30)
    assert listing.returncode == 0 and json.loads(listing.stdout)[0]["status"] == "incomplete"
    assert "run.json is missing or unreadable" in refused(sprite(sprite_cmd, "runs", "verify", run, timeout=30), 1)
    beats = tmp_path / "beats"
    beats.mkdir()
    os.mkfifo(beats / "rank0.json")
    assert _finishes(lambda: heartbeat.read_all(beats), beats / "rank0.json") == {}


def test_a_huge_manifest_or_audit_trail_is_refused_without_reading_it(sprite_cmd, tmp_path):
    ckpt = tmp_path / "one.ckpt"
    ckpt.write_bytes(b"weights")
    with open(integrity.manifest_path(ckpt), "wb") as out:
        out.truncate(3 << 30)  # sparse: 3 GB on paper
    line = refused(sprite(sprite_cmd, "ckpt", "verify", ckpt, memory=1 << 30), 1)
    assert "larger than" in line
    run = _run(tmp_path)
    with open(run / rundir.AUDIT, "r+b") as out:
        out.truncate(3 << 30)
    assert "larger than" in refused(sprite(sprite_cmd, "runs", "verify", run, memory=1 << 30), 1)
    listing = sprite(sprite_cmd, "runs", tmp_path / "runs", "--json", memory=1 << 30)
    assert listing.returncode == 0 and json.loads(listing.stdout)[0]["status"] == "damaged"


# 4. Tracebacks in record reading

@pytest.mark.parametrize("files", [{"one.ckpt": "x"}, {"one.ckpt": {"size": "7", "sha256": "0" * 64}},
                                   {"one.ckpt": {"size": 7}}, {"one.ckpt": {"size": 7, "sha256_chunks": [1]}},
                                   {"one.ckpt": {"size": 7, "sha256": "0" * 64}, "x": []}])
def test_a_manifest_with_wrong_types_is_one_line(sprite_cmd, tmp_path, files):
    ckpt = tmp_path / "one.ckpt"
    ckpt.write_bytes(b"weights")
    _forge(ckpt, files)
    refused(sprite(sprite_cmd, "ckpt", "verify", ckpt), 1)
    listing = sprite(sprite_cmd, "ckpt", "list", tmp_path)
    assert listing.returncode == 0 and "Traceback" not in listing.stderr, listing.stderr[-2000:]


def test_json_nested_100000_deep_is_one_line(sprite_cmd, tmp_path):
    ckpt = tmp_path / "one.ckpt"
    ckpt.write_bytes(b"weights")
    integrity.manifest_path(ckpt).write_bytes(DEEP)
    assert "unreadable" in refused(sprite(sprite_cmd, "ckpt", "verify", ckpt), 1)
    run = _run(tmp_path)
    with open(run / rundir.AUDIT, "ab") as out:
        out.write(DEEP + b"\n")
    assert "line 2" in refused(sprite(sprite_cmd, "runs", "verify", run), 1)
    (run / rundir.AUDIT).write_bytes(DEEP + b"\n")
    listing = sprite(sprite_cmd, "runs", tmp_path / "runs", "--json")
    assert listing.returncode == 0 and json.loads(listing.stdout)[0]["status"] == "damaged", listing.stderr
    other = _run(tmp_path / "b")
    (other / rundir.SUMMARY).write_bytes(DEEP)
    assert "run.json is missing or unreadable" in refused(sprite(sprite_cmd, "runs", "verify", other), 1)
    assert sprite(sprite_cmd, "runs", tmp_path / "b" / "runs").returncode == 0
    bench = tmp_path / "bench.json"
    bench.write_bytes(DEEP)
    refused(sprite(sprite_cmd, "bench", "compare", bench, bench), 2)


def _rechained(path: Path, records: list[dict]) -> None:
    """A trail that verifies (the chain is unkeyed: anyone who can write the folder can rebuild it)."""
    path.unlink()
    for record in records:
        fields = {k: v for k, v in record.items() if k not in audit.RESERVED}
        audit.append(path, record.get("kind", "x"), **fields)


@pytest.mark.parametrize("records", [
    [{"kind": "completion"}],
    [{"kind": "launch", "time_": 1}, {"kind": "attempt_end", "node_hours": "x", "device_hours": [1]},
     {"kind": "completion", "status": 3, "exit_code": "x"}],
    [{"kind": "attempt_start"}, {"kind": "resume", "path": {"a": 1}}, {"kind": "attempt_end", "node_hours": 1e308,
                                                                      "device_hours": 1e308}],
])
def test_runs_of_the_wrong_shape_are_listed_not_a_traceback(sprite_cmd, tmp_path, records):
    run = _run(tmp_path)
    _rechained(run / rundir.AUDIT, records)
    rundir.write_summary(run, {"audit_tail": audit.read(run / rundir.AUDIT)[-1][canonical.SELF]})
    for args in (["runs", tmp_path / "runs"], ["runs", tmp_path / "runs", "--json"], ["runs", "verify", run]):
        done = sprite(sprite_cmd, *args)
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]


@pytest.mark.parametrize("summary", [[1, 2], {"audit_tail": 5}, {"pid": 1e30}, {"pid": 10 ** 30}, {"pid": -1},
                                     {"pid": 0}, {"pid": True}, {"host": ["x"], "pid": 1}, "text"])
def test_a_run_json_of_the_wrong_shape_is_not_a_traceback_nor_running(sprite_cmd, tmp_path, summary):
    run = _run(tmp_path)
    info = {"host": os.uname().nodename, **summary} if isinstance(summary, dict) else summary
    (run / rundir.SUMMARY).write_text(json.dumps(info))
    listing = sprite(sprite_cmd, "runs", tmp_path / "runs", "--json")
    assert listing.returncode == 0 and json.loads(listing.stdout)[0]["status"] == "incomplete", listing.stderr[-2000:]
    done = sprite(sprite_cmd, "runs", "verify", run)
    # run.json that is not an object cannot name the trail's end: verify cannot vouch for it (exit 1)
    assert done.returncode == (0 if isinstance(summary, dict) else 1), done.stderr[-2000:]
    assert "Traceback" not in done.stderr and done.stderr.count("\n") <= 1, done.stderr[-2000:]


def test_a_deep_sub_folder_chain_is_one_line(sprite_cmd, tmp_path):
    try:
        _deep_chain_is_one_line(sprite_cmd, tmp_path)
    finally:
        remove_tree(tmp_path)
        tmp_path.mkdir()


def _deep_chain_is_one_line(sprite_cmd, tmp_path):
    folder = _sealed_folder(tmp_path)
    deep = folder
    for _ in range(1100):  # one by one: pathlib's mkdir(parents=True) recurses
        deep = deep / "d"
        os.mkdir(deep)
    (deep / "f").write_bytes(b"x")
    line = refused(sprite(sprite_cmd, "ckpt", "verify", folder), 1)
    assert "not listed" in line
    other = tmp_path / "other"
    other.mkdir()
    (other / "f").write_bytes(b"y")
    (folder / "d").rename(other / "d")
    integrity.seal(other, {"step": 1})  # sealing walks it too
    assert integrity.verify(other).valid


def test_a_bad_heartbeat_is_skipped_and_never_kills_the_watchdog(tmp_path):
    good = {"rank": 0, "host": "h", "pid": 7, "step": 5, "phase": heartbeat.TRAINING, "count": 3, "time": 1.0}
    for rank, change in enumerate([{}, {"step": "x"}, {"count": None}, {"time": "now"}, {"rank": -1}, {"rank": True},
                                   {"phase": 3}, {"first_step": 1.5}, {"host": 1}, {"pid": [1]}, {"extra": 1}]):
        (tmp_path / f"rank{rank}.json").write_text(json.dumps({**good, "rank": rank, **change}))
    (tmp_path / "rank99.json").write_text("[" * 100_000)
    (tmp_path / "rank98.json").write_text("[1]")
    beats = heartbeat.read_all(tmp_path)
    assert list(beats) == [0]
    watch = watchdog.Watch(watchdog.Limits.from_options(1.0), 12, 0.0)
    assert watch.observe(beats, 1.0) is None
    assert watch.observe(beats, 1000.0) is not None  # a stall found, not a TypeError


def test_verify_dot_inside_a_valid_checkpoint(sprite_cmd, tmp_path):
    folder = _sealed_folder(tmp_path)
    done = sprite(sprite_cmd, "ckpt", "verify", ".", cwd=folder)
    assert done.returncode == 0 and done.stdout.startswith("valid"), done.stderr


def test_a_forged_completion_status_shows_as_unknown():
    from sprite.recovery import summary

    forged = summary.summarize([{"kind": "completion", "status": "0", "time": 5, "exit_code": True}])
    assert (forged["status"], forged["ended"], forged["exit_code"]) == ("unknown", "", None)
    assert summary.summarize([{"kind": "completion", "status": "stalled"}])["status"] == "stalled"


def test_a_manifest_audit_trail_or_run_json_that_is_a_symlink_is_refused_though_its_target_is_valid(sprite_cmd,
                                                                                                    tmp_path):
    """docs/checkpoints.md: a symlink in a record's place is refused unread, even one to a byte-identical valid copy
    (so what a link points at never decides what sprite trusts)."""
    ckpt = tmp_path / "one.ckpt"
    ckpt.write_bytes(b"weights")
    integrity.seal(ckpt, {"step": 1})
    manifest = integrity.manifest_path(ckpt)
    assert integrity.verify(ckpt).valid
    copy = tmp_path / "elsewhere.json"
    copy.write_bytes(manifest.read_bytes())
    manifest.unlink()
    manifest.symlink_to(copy)
    assert "symlink" in refused(sprite(sprite_cmd, "ckpt", "verify", ckpt, timeout=30), 1)
    listing = sprite(sprite_cmd, "ckpt", "list", tmp_path, "--json", timeout=30)
    assert listing.returncode == 0 and json.loads(listing.stdout)[0]["valid"] is False
    run = _run(tmp_path)
    audit.append(run / rundir.AUDIT, "attempt_start", attempt=1)  # past the end run.json names
    assert "lines were removed" in refused(sprite(sprite_cmd, "runs", "verify", run, timeout=30), 1)

    def linked(name: str) -> None:
        real, moved = run / name, tmp_path / f"moved-{name}"
        moved.write_bytes(real.read_bytes())
        real.unlink()
        real.symlink_to(moved)

    linked(rundir.SUMMARY)  # not read, so the end it names cannot be compared: the record past it is not hidden
    assert "run.json is missing or unreadable" in refused(sprite(sprite_cmd, "runs", "verify", run, timeout=30), 1)
    linked(rundir.AUDIT)
    assert "symlink" in refused(sprite(sprite_cmd, "runs", "verify", run, timeout=30), 1)
    listing = sprite(sprite_cmd, "runs", tmp_path / "runs", "--json", timeout=30)
    found = json.loads(listing.stdout)[0]
    assert listing.returncode == 0 and found["status"] == "damaged" and "symlink" in found["reason"], found
