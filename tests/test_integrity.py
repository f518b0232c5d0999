"""sprite.integrity: files written once, manifests sealed last, and every single-byte change detected."""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import stat
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sprite import integrity
from sprite.integrity import IntegrityError


META = pickle.dumps(b"m" * 25, protocol=4)  # 40 bytes, a pickle that holds no global (as .metadata must)


def _mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def _folder(root: Path) -> Path:
    ckpt = root / "ckpt"
    integrity.make_dir_new(ckpt)
    (ckpt / "shards").mkdir()
    integrity.write_new(ckpt / ".metadata", META)
    integrity.write_new(ckpt / "shards" / "__0_0.distcp", bytes(range(256)) * 3)
    return ckpt


@pytest.mark.parametrize("umask", [0o000, 0o077, 0o277])
def test_write_new_creates_0600_whatever_the_umask(tmp_path, umask):
    old = os.umask(umask)
    try:
        integrity.write_new(tmp_path / "f", b"x")
        integrity.make_dir_new(tmp_path / "d")
    finally:
        os.umask(old)
    assert (_mode(tmp_path / "f"), _mode(tmp_path / "d")) == (0o600, 0o700)
    assert (tmp_path / "f").read_bytes() == b"x"


def test_write_new_never_replaces_a_file_nor_follows_a_symlink(tmp_path):
    victim = tmp_path / "users_file"
    victim.write_bytes(b"precious")
    victim.chmod(0o644)
    (tmp_path / "link").symlink_to(victim)
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    for name in ("users_file", "link", "dangling"):
        with pytest.raises(IntegrityError, match="already exists"):
            integrity.write_new(tmp_path / name, b"overwritten")
    with pytest.raises(IntegrityError, match="already exists"):
        integrity.make_dir_new(tmp_path / "link")
    assert victim.read_bytes() == b"precious" and _mode(victim) == 0o644
    assert not (tmp_path / "nowhere").exists()


def test_sha256_file_streams_and_refuses_symlinks(tmp_path):
    data = os.urandom(3 << 20)
    (tmp_path / "big").write_bytes(data)
    assert integrity.sha256_file(tmp_path / "big") == hashlib.sha256(data).hexdigest()
    (tmp_path / "link").symlink_to(tmp_path / "big")
    with pytest.raises(OSError):
        integrity.sha256_file(tmp_path / "link")


def test_a_large_file_is_described_by_the_sha256_of_each_piece(tmp_path, monkeypatch):
    from sprite.integrity import digest

    monkeypatch.setattr(digest, "CHUNK", 4096)
    data = os.urandom(3 * 4096 + 17)
    (tmp_path / "big").write_bytes(data)
    entry = integrity.describe(tmp_path / "big")["big"]
    pieces = [data[i:i + 4096] for i in range(0, len(data), 4096)]
    assert entry == {"size": len(data), "chunk_bytes": 4096,
                     "sha256_chunks": [hashlib.sha256(p).hexdigest() for p in pieces]}
    ran = []
    with open(tmp_path / "big", "rb") as f:  # an open file, with an fsync (here a marker) on the same pool
        assert digest.open_file(f.fileno(), beside=lambda: ran.append(os.fsync(f.fileno()))) == entry
    assert ran == [None]
    for size in (0, 4096, 8192):  # empty, exactly one piece, exactly two
        (tmp_path / f"part{size}").write_bytes(data[:size])
        with open(tmp_path / f"part{size}", "rb") as f:
            assert [digest.open_file(f.fileno())] == digest.files([tmp_path / f"part{size}"])
    assert digest.files([tmp_path / "part0"]) == [{"size": 0, "sha256": hashlib.sha256(b"").hexdigest()}]
    assert digest.files([tmp_path / "part8192"])[0]["sha256_chunks"] == [hashlib.sha256(data[:4096]).hexdigest(),
                                                                         hashlib.sha256(data[4096:8192]).hexdigest()]
    with open(tmp_path / "big", "rb") as f, pytest.raises(OSError, match="disk full"):
        digest.open_file(f.fileno(), beside=lambda: (_ for _ in ()).throw(OSError("disk full")))  # a failed fsync
    assert integrity.describe(tmp_path, []) == {}  # a rank that wrote no file of a save describes none
    (tmp_path / "small").write_bytes(data[:4096])  # one piece: the whole-file digest, as sha256sum prints
    assert digest.files([tmp_path / "small"]) == [{"size": 4096, "sha256": hashlib.sha256(data[:4096]).hexdigest()}]
    integrity.seal(tmp_path / "big", {"step": 1})
    assert integrity.verify(tmp_path / "big").valid
    os.unlink(tmp_path / "big")
    flipped = bytearray(data)
    flipped[2 * 4096 + 5] ^= 1  # one bit in the third piece, the size unchanged
    (tmp_path / "big").write_bytes(bytes(flipped))
    assert "big does not match its SHA-256" in integrity.verify(tmp_path / "big").reason
    monkeypatch.setattr(digest, "CHUNK", 8192)  # a manifest made with other pieces is never taken as valid
    (tmp_path / "big").unlink()
    (tmp_path / "big").write_bytes(data)
    assert not integrity.verify(tmp_path / "big").valid


def test_a_sealed_folder_verifies_and_is_sealed_once(tmp_path):
    ckpt = _folder(tmp_path)
    path = integrity.seal(ckpt, {"step": 3})
    assert path == ckpt / "sprite-manifest.json" == integrity.manifest_path(ckpt) and _mode(path) == 0o600
    verdict = integrity.verify(ckpt)
    assert verdict.valid and verdict.reason == "" and verdict.manifest["meta"] == {"step": 3}
    assert sorted(verdict.manifest["files"]) == [".metadata", "shards/__0_0.distcp"]
    assert sorted(os.listdir(ckpt)) == [".metadata", "shards", "sprite-manifest.json"]  # no temporary left
    before = path.read_bytes()
    with pytest.raises(IntegrityError, match="already exists"):
        integrity.seal(ckpt, {"step": 4})
    assert path.read_bytes() == before


def test_a_sealed_file_has_its_manifest_beside_it(tmp_path):
    integrity.write_new(tmp_path / "a.ckpt", b"weights")
    path = integrity.seal(tmp_path / "a.ckpt", {"step": 1})
    assert path == tmp_path / "a.ckpt.sprite-manifest.json"
    assert integrity.verify(tmp_path / "a.ckpt").valid
    integrity.write_new(tmp_path / "b.ckpt", b"weights")
    (tmp_path / "b.ckpt.sprite-manifest.json").write_bytes(path.read_bytes())  # a copied manifest
    assert "describes another target ('a.ckpt')" in integrity.verify(tmp_path / "b.ckpt").reason


def test_seal_takes_the_files_each_rank_described(tmp_path):
    ckpt = _folder(tmp_path)
    files = {**integrity.describe(ckpt, [".metadata"]), **integrity.describe(ckpt, ["shards/__0_0.distcp"])}
    integrity.seal(ckpt, {}, files)
    assert integrity.verify(ckpt).valid
    with pytest.raises(IntegrityError, match="does not exist"):
        integrity.seal(tmp_path / "never_written", {})


@pytest.mark.parametrize("damage, reason", [
    (lambda c: (c / "sprite-manifest.json").unlink(), "has no manifest"),
    (lambda c: (c / "shards" / "__0_0.distcp").unlink(), "shards/__0_0.distcp is missing"),
    (lambda c: os.truncate(c / ".metadata", 3), ".metadata has 3 bytes, the manifest says 40"),
    (lambda c: (c / ".metadata").write_bytes(b"META" * 10), ".metadata does not match its SHA-256"),
    (lambda c: (c / "extra.bin").write_bytes(b""), "extra.bin is not listed in the manifest"),
    (lambda c: (c / "shards" / "ln").symlink_to(c / ".metadata"), "shards/ln is not listed"),
    (lambda c: (c / "sprite-manifest.json").write_text("{}"), "manifest .* is unreadable"),
])
def test_verify_names_what_is_wrong(tmp_path, damage, reason):
    ckpt = _folder(tmp_path)
    integrity.seal(ckpt, {"step": 3})
    damage(ckpt)
    verdict = integrity.verify(ckpt)
    assert not verdict.valid
    assert __import__("re").search(reason, verdict.reason), verdict.reason


def test_verify_refuses_a_missing_target_and_a_symlinked_file(tmp_path):
    assert "does not exist" in integrity.verify(tmp_path / "nope").reason
    ckpt = _folder(tmp_path)
    (ckpt / "shards" / "__0_0.distcp").rename(tmp_path / "elsewhere")
    (ckpt / "shards" / "__0_0.distcp").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(IntegrityError, match="not a regular file"):
        integrity.seal(ckpt, {})


@pytest.fixture(scope="module")
def sealed_bytes(tmp_path_factory) -> dict:
    """The files of one sealed folder, as {relpath: bytes}, sealed once for every flip below."""
    ckpt = _folder(tmp_path_factory.mktemp("sealed"))
    integrity.seal(ckpt, {"step": 7, "epoch": 1, "strategy": "ddp"})
    return {rel: (ckpt / rel).read_bytes() for rel in (".metadata", "shards/__0_0.distcp", "sprite-manifest.json")}


@settings(max_examples=150, deadline=None)
@given(which=st.integers(0, 2), position=st.integers(0, 10**6), mask=st.integers(1, 255))
def test_any_single_flipped_byte_in_a_sealed_folder_is_detected(sealed_bytes, which, position, mask):
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = Path(tmp) / "ckpt"
        (ckpt / "shards").mkdir(parents=True)
        for rel, data in sealed_bytes.items():
            (ckpt / rel).write_bytes(data)
        assert integrity.verify(ckpt).valid
        victim = ckpt / sorted(sealed_bytes)[which]
        data = bytearray(victim.read_bytes())
        data[position % len(data)] ^= mask
        victim.write_bytes(bytes(data))
        assert not integrity.verify(ckpt).valid


def test_hashing_threads_share_the_nodes_cores_and_leave_the_training_loop_some_beside_it(monkeypatch):
    """The main thread (a verify, a synchronous save) hashes on the rank's share of the cores (its node's cores
    divided among its ranks, or the cores it is bound to); a background save's thread leaves ``SPARE`` of them to the
    training loop (benchmarks/hash_beside.py); never fewer than 1."""
    import threading

    from sprite.integrity import digest

    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    monkeypatch.setattr(digest, "cgroup_cpus", lambda: None)  # this machine's own cgroup has no say here
    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)

    def beside() -> int:
        got = []
        thread = threading.Thread(target=lambda: got.append(digest.workers()))
        thread.start()
        thread.join()
        return got[0]

    assert digest.rank_cores() == 16 and digest.workers() == 16 and beside() == 16 - digest.SPARE
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert digest.rank_cores() == 4 and digest.workers() == 4 and beside() == 4 - digest.SPARE
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "12")
    assert digest.rank_cores() == 1 and digest.workers() == 1 and beside() == 1
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "two")  # not sprite's: taken as one rank
    assert digest.rank_cores() == 16
    monkeypatch.setattr(os, "cpu_count", lambda: 208)  # a rank bound to 8 of a node's 208 cores keeps its 8
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8, 16)))
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "12")
    assert digest.rank_cores() == 8 and digest.workers() == 8 and beside() == 8 - digest.SPARE
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(208)))  # unbound: 208 // 12
    assert digest.rank_cores() == 17 and beside() == 15
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)))
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert digest.workers() == digest.MAX_WORKERS


def _cores(monkeypatch, cgroup: int | None) -> int:
    """rank_cores where this process's cgroup holds ``cgroup`` CPUs (None: none to read)."""
    from sprite.integrity import digest

    monkeypatch.setattr(digest, "cgroup_cpus", lambda: cgroup)
    return digest.rank_cores()


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_ranks_confined_together_to_a_cgroups_cores_share_them(tmp_path, monkeypatch, version):
    """A batch job's cgroup may confine all of a node's ranks to 16 of its 208 cores without binding each rank:
    every rank's affinity is then those 16, fewer than the machine's, which alone would look bound. Affinity equal
    to the cgroup's cpuset counts as shared among the node's ranks; narrower, as bound. The cgroup files are FAKES
    laid out as the kernel's (cgroup v1 and v2)."""
    from sprite.integrity import digest

    proc, root = tmp_path / "cgroup", tmp_path / "sys"
    if version == "v2":
        proc.write_text("0::/slurm/job_7/step_0\n")
        folder, name = root / "slurm/job_7/step_0", "cpuset.cpus.effective"
    else:
        proc.write_text("4:memory:/slurm/job_7\n3:cpuset:/slurm/job_7/step_0\n0::/\n")
        folder, name = root / "cpuset/slurm/job_7/step_0", "cpuset.effective_cpus"
    folder.mkdir(parents=True)
    (folder / name).write_text("0-7,104-111\n")
    assert digest.cgroup_cpus(str(proc), str(root)) == 16
    assert digest.cgroup_cpus(str(tmp_path / "missing"), str(root)) is None
    (folder / name).write_text("not a list\n")
    assert digest.cgroup_cpus(str(proc), str(root)) is None
    monkeypatch.setattr(os, "cpu_count", lambda: 208)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(8)) | set(range(104, 112)))
    assert _cores(monkeypatch, 16) == 4  # the job's 16 cores shared by its node's 4 ranks
    assert _cores(monkeypatch, None) == 16  # no cgroup to read: taken as bound, as before
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(4)))
    assert _cores(monkeypatch, 16) == 4  # bound to 4 of the job's 16: keeps them
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(2)))
    assert _cores(monkeypatch, 16) == 2


def test_the_sizes_and_thread_counts_docs_checkpoints_gives_are_the_codes():
    """docs/checkpoints.md's numbers. The 64 MiB piece is also a format fact: a manifest records its chunk_bytes,
    and digest.same compares pieces only at the same size, so changing CHUNK would fail every checkpoint over
    64 MiB sealed before."""
    from sprite.integrity import digest
    from sprite.runtime.ckpt import dcp_read, dcp_write

    page = (Path(__file__).resolve().parents[1] / "docs" / "checkpoints.md").read_text()
    page = " ".join(page.split())
    assert digest.CHUNK == 64 << 20 and "the SHA-256 of each 64 MiB piece" in page
    assert digest.MAX_WORKERS == 32 and "up to 32" in page
    assert digest.SPARE == 2 and "on 2 fewer" in page
    assert dcp_write.MAX_THREADS == 4 and "up to 4 files per rank" in page
    assert dcp_read.READ_THREADS == 2 and dcp_read.SPAN_BYTES == 64 << 20
    assert "two threads read the shard files ahead in runs of up to 64 MiB" in page


def test_replace_own_leaves_the_old_file_and_no_temporary_one_when_it_fails_and_never_follows_a_link(tmp_path,
                                                                                                   monkeypatch):
    """run.json and the heartbeats: a failed update left its temporary file, named by pid, and every later update
    of that process then failed on it (run.json stayed "running"); the heartbeat's was opened through a symlink."""
    import secrets

    from sprite.contract import heartbeat
    from sprite.recovery import rundir

    rundir.write_summary(tmp_path, {"status": "running"})
    real = os.replace
    monkeypatch.setattr(os, "replace", lambda *a: (_ for _ in ()).throw(OSError(28, "No space left on device")))
    with pytest.raises(OSError):
        rundir.write_summary(tmp_path, {"status": "succeeded"})
    monkeypatch.setattr(os, "replace", real)
    assert json.loads((tmp_path / "run.json").read_text()) == {"status": "running"}
    rundir.write_summary(tmp_path, {"status": "succeeded"})
    assert json.loads((tmp_path / "run.json").read_text()) == {"status": "succeeded"}
    assert os.listdir(tmp_path) == ["run.json"]

    precious = tmp_path / "precious.txt"
    precious.write_text("mine")
    beats = tmp_path / "hb"
    beats.mkdir()
    monkeypatch.setattr(secrets, "token_hex", lambda n: "f" * (2 * n))
    (beats / f".rank0.{'f' * 12}.tmp").symlink_to(precious)
    with pytest.raises(FileExistsError):
        heartbeat.write(beats, heartbeat.Beat(0, "h", 1, 2, heartbeat.TRAINING, 3, 0.0, 0))
    assert precious.read_text() == "mine" and not (beats / "rank0.json").exists()
