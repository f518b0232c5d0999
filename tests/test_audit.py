"""sprite.integrity.audit: a hash-chained, append-only trail; every edit, reorder, insertion or cut is detected."""

from __future__ import annotations

import multiprocessing
import os
import stat
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sprite.integrity import audit
from sprite.integrity import IntegrityError


def _trail(folder: Path, count: int = 4) -> Path:
    path = folder / "audit.jsonl"
    for step in range(count):
        audit.append(path, "checkpoint_written", path=f"ckpt/step={step}.ckpt", step=step, verified=True)
    return path


def test_records_chain_to_the_genesis_value_and_read_back(tmp_path):
    first = audit.append(tmp_path / "audit.jsonl", "launch", hosts=["a", "b"], world_size=2)
    second = audit.append(tmp_path / "audit.jsonl", "attempt_start", attempt=1)
    assert (first["seq"], first["prev"], second["seq"]) == (0, audit.GENESIS, 1)
    assert first["time"].endswith("+00:00")
    assert stat.S_IMODE(os.stat(tmp_path / "audit.jsonl").st_mode) == 0o600
    assert audit.read(tmp_path / "audit.jsonl") == [first, second]
    assert audit.verify(tmp_path / "audit.jsonl") == (True, "2 records")


def test_reserved_names_and_symlinks_are_refused(tmp_path):
    with pytest.raises(ValueError, match="reserved"):
        audit.append(tmp_path / "audit.jsonl", "launch", seq=5)
    victim = tmp_path / "users_file"
    victim.write_text("mine\n")
    (tmp_path / "link.jsonl").symlink_to(victim)
    with pytest.raises(IntegrityError, match="symlink"):
        audit.append(tmp_path / "link.jsonl", "launch")
    assert victim.read_text() == "mine\n"


def _lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


@pytest.mark.parametrize("edit, reason", [
    (lambda ls: [ls[0], ls[2], ls[1], ls[3]], "line 2: prev does not match line 1"),
    (lambda ls: [ls[0], ls[1], ls[3]], "line 3: prev does not match line 2"),
    (lambda ls: [ls[0], ls[1], ls[1], ls[2], ls[3]], "line 3: prev does not match line 2"),
    (lambda ls: ls[1:], "line 1: prev does not match the genesis value"),
    (lambda ls: [*ls[:3], ls[3][:20]], "line 4: incomplete"),
    (lambda ls: [ls[0], ls[1].replace(b'"step":1', b'"step":9'), *ls[2:]], "line 2: its content does not match"),
])
def test_edited_reordered_inserted_or_cut_trails_fail(tmp_path, edit, reason):
    path = _trail(tmp_path)
    path.write_bytes(b"".join(edit(_lines(path))))
    ok, why = audit.verify(path)
    assert not ok and why.startswith(reason), why


def test_removing_whole_last_lines_is_only_seen_against_a_kept_head(tmp_path):
    path = _trail(tmp_path)
    head = audit.read(path)[-1]["self_sha256"]
    path.write_bytes(b"".join(_lines(path)[:-1]))
    assert audit.verify(path) == (True, "3 records")  # the documented limit: a shorter trail is a valid trail
    assert audit.read(path)[-1]["self_sha256"] != head


def test_a_torn_last_line_stops_further_appends(tmp_path):
    path = _trail(tmp_path, 2)
    with open(path, "ab") as handle:
        handle.write(b'{"kind":')
    with pytest.raises(IntegrityError, match="incomplete line"):
        audit.append(path, "resume")
    with pytest.raises(IntegrityError, match="Line 3 .* incomplete"):
        audit.read(path)


def _writer(path: str, worker: int) -> None:
    for index in range(15):
        audit.append(path, "beat", worker=worker, index=index)


def test_concurrent_appenders_never_fork_the_chain(tmp_path):
    path = str(tmp_path / "audit.jsonl")
    context = multiprocessing.get_context("fork")
    workers = [context.Process(target=_writer, args=(path, w)) for w in range(4)]
    for proc in workers:
        proc.start()
    for proc in workers:
        proc.join(60)
    assert [proc.exitcode for proc in workers] == [0, 0, 0, 0]
    assert audit.verify(path) == (True, "60 records")
    assert sorted((r["worker"], r["index"]) for r in audit.read(path)) == [(w, i) for w in range(4) for i in range(15)]


@pytest.fixture(scope="module")
def trail_bytes(tmp_path_factory) -> bytes:
    return _trail(tmp_path_factory.mktemp("trail"), 3).read_bytes()


@settings(max_examples=200, deadline=None)
@given(position=st.integers(0, 10**6), mask=st.integers(1, 255))
def test_any_single_flipped_byte_is_detected(trail_bytes, position, mask):
    data = bytearray(trail_bytes)
    data[position % len(data)] ^= mask
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "audit.jsonl"
        path.write_bytes(trail_bytes)
        assert audit.verify(path)[0]
        path.write_bytes(bytes(data))
        assert not audit.verify(path)[0]
