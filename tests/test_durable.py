"""Checkpoint data made durable in the background (sprite.runtime.ckpt.durable): a save to a new name returns before
its fsync, a superseded checkpoint is removed only after it, and a failure keeps the older checkpoint."""

from __future__ import annotations

import os
import pickle
import threading
from pathlib import Path

import pytest

from sprite.runtime.ckpt import durable
from sprite.runtime.ckpt import save as hashed_save


@pytest.fixture
def held_fsync(monkeypatch):
    """os.fsync on the background thread waits until the test sets the returned event."""
    release, fsync, calls = threading.Event(), os.fsync, []

    def fsync_held(fd):
        if threading.current_thread().name == "sprite-durable":
            calls.append(os.readlink(f"/proc/self/fd/{fd}"))
            assert release.wait(60)
        fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync_held)
    yield release, calls
    release.set()
    assert durable.drain(60)


def test_a_new_checkpoint_is_removed_after_the_newer_one_is_on_disk(tmp_path, held_fsync):
    release, calls = held_fsync
    old, new = tmp_path / "epoch=0.ckpt", tmp_path / "epoch=1.ckpt"
    old.write_bytes(b"an older checkpoint")
    hashed_save.atomic_save({"w": [1]}, new)  # returns while its fsync waits on the background thread
    durable.saved([])
    removed = threading.Event()
    durable.remove_later(old, lambda: (os.unlink(old), removed.set()))
    assert not removed.wait(0.5) and old.exists()  # the older checkpoint stays until the newer one is durable
    release.set()
    assert durable.drain(60) and removed.is_set() and not old.exists() and new.exists()
    assert calls == [str(new)]


def test_a_removal_skips_a_name_saved_again_since(tmp_path):
    path = tmp_path / "last.ckpt"
    path.write_bytes(b"first")
    gate = threading.Event()
    durable.later(lambda: gate.wait(60))  # the queue is busy while the name is used again
    durable.remove_later(path, lambda: os.unlink(path))
    replacement = tmp_path / ".new"
    replacement.write_bytes(b"second")
    os.replace(replacement, path)
    gate.set()
    assert durable.drain(60) and path.read_bytes() == b"second"


def test_a_failed_background_fsync_keeps_the_older_checkpoint_and_stops_the_next_save(tmp_path, monkeypatch,
                                                                                      capfd):
    monkeypatch.setattr(durable, "_failed", [])
    old, new = tmp_path / "a.ckpt", tmp_path / "b.ckpt"
    old.write_bytes(b"old")
    new.write_bytes(b"new")
    fsync = os.fsync

    def broken(fd):
        if threading.current_thread().name == "sprite-durable":
            raise OSError(5, "Input/output error")
        fsync(fd)

    monkeypatch.setattr(os, "fsync", broken)
    durable.saved([str(new)])
    durable.remove_later(old, lambda: os.unlink(old))
    assert durable.drain(60)
    assert old.exists() and f"kept {old}: a newer checkpoint could not be made durable" in capfd.readouterr().err
    with pytest.raises(OSError, match="could not be made durable in the background: OSError.*Input/output"):
        durable.check()


def test_removal_waits_until_every_rank_counted_the_newest_save(tmp_path, monkeypatch):
    from torch.distributed import TCPStore

    store = TCPStore("127.0.0.1", 0, 2, True, wait_for_workers=False)
    monkeypatch.setattr(durable, "_store", lambda: (store, 2))
    old = tmp_path / "old.ckpt"
    old.write_bytes(b"old")
    durable.saved([])  # this rank's share of the newest save: nothing to fsync
    durable.remove_later(old, lambda: os.unlink(old))
    assert not durable.drain(1.0) and old.exists()  # the other rank has not counted the save in
    store.add(durable._key(durable._saves), 1)  # ... now it has
    assert durable.drain(60) and not old.exists()


def test_the_next_save_stops_when_a_background_fsync_failed(monkeypatch, tmp_path):
    from sprite.runtime.ckpt import seal as ckpt_seal

    monkeypatch.setattr(durable, "_failed", ["OSError: [Errno 5] Input/output error"])
    called = []
    with pytest.raises(OSError, match="could not be made durable"):
        ckpt_seal.save_checkpoint(lambda *a: called.append(a), None, tmp_path / "next.ckpt")
    assert not called and not (tmp_path / "next.ckpt").exists()


def test_a_folder_replacing_one_of_the_same_name_is_fsynced_during_the_save(tmp_path, monkeypatch):
    from sprite.runtime.ckpt import seal as ckpt_seal

    for name in (".metadata", "__0_0.distcp"):
        (tmp_path / name).write_bytes(b"shard")
    synced, fsync = [], os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(os.readlink(f"/proc/self/fd/{fd}")), fsync(fd))[1])
    ok, files, later = ckpt_seal.describe_mine(tmp_path, 0, 1, sync=False)  # a new name: fsync left for later
    assert ok and set(files) == {".metadata", "__0_0.distcp"} and not synced
    assert sorted(later) == [str(tmp_path / ".metadata"), str(tmp_path / "__0_0.distcp")]
    ok, files, later = ckpt_seal.describe_mine(tmp_path, 0, 1, sync=True)  # swapped in over a name in use
    assert ok and later == [] and sorted(synced) == [str(tmp_path / ".metadata"), str(tmp_path / "__0_0.distcp")]


class _Strategy:  # what ckpt_seal.save_checkpoint asks of a one-process Lightning strategy
    is_global_zero = True

    def broadcast(self, obj):
        return obj

    def barrier(self, name=None):
        pass


def test_a_save_to_a_new_name_makes_no_fsync_on_the_training_loop(tmp_path, monkeypatch):
    import types

    from sprite import contract, integrity
    from sprite.integrity import audit
    from sprite.runtime.ckpt import seal as ckpt_seal

    monkeypatch.setenv(contract.RUN_DIR, str(tmp_path))
    trail = tmp_path / "audit.jsonl"
    audit.append(trail, "launch")  # a run's trail exists before its first save
    synced, fsync = [], os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append((threading.current_thread().name, os.readlink(
        f"/proc/self/fd/{fd}"))), fsync(fd))[1])
    trainer = types.SimpleNamespace(strategy=_Strategy(), global_step=3, current_epoch=0, world_size=1, global_rank=0)
    target = tmp_path / "ckpt" / "epoch=0-step=3.ckpt"
    target.parent.mkdir()

    def save(_trainer, path, _weights_only, _options):
        hashed_save.atomic_save({"w": list(range(100))}, path)

    gate = threading.Event()
    durable.later(lambda: gate.wait(60))  # the background thread is busy: nothing of this save is fsynced yet
    ckpt_seal.save_checkpoint(save, trainer, target)
    assert integrity.verify(target).valid and not synced  # sealed and recorded when the save returns ...
    assert [(r["kind"], r.get("path")) for r in audit.read(trail)] == [("launch", None),
                                                                       ("checkpoint_written", str(target))]
    gate.set()
    assert durable.drain(60)
    manifest = str(integrity.manifest_path(target))
    assert {name for name, _ in synced} == {"sprite-durable"}, synced  # ... and fsynced in the background
    assert {str(target), manifest, str(trail), str(target.parent)} <= {path for _, path in synced}
    synced.clear()
    ckpt_seal.save_checkpoint(save, trainer, target)  # the same name again (last.ckpt): durable before it returns
    main = [path for name, path in synced if name == "MainThread"]
    assert not [name for name, _ in synced if name == "sprite-durable"], synced
    assert str(target.parent) in main and [p for p in main if os.path.basename(p).startswith(".sprite-manifest")], main
    assert [p for name, p in synced if name.startswith("ThreadPool") and ".epoch=0-step=3.ckpt.sprite-tmp" in p]
    assert durable.drain(60) and integrity.verify(target).valid


def test_a_save_that_was_not_sealed_keeps_the_checkpoint_it_was_to_supersede(tmp_path, capfd):
    old = tmp_path / "epoch=0.ckpt"
    old.write_bytes(b"old")
    durable.saved([], sealed=False)  # rank 0: a rank could not confirm its files, no manifest
    durable.remove_later(old, lambda: os.unlink(old))
    assert durable.drain(60) and old.exists()
    assert f"kept {old}: the newer checkpoint was not sealed" in capfd.readouterr().err


def test_a_checkpoint_a_rank_could_not_confirm_supersedes_nothing(tmp_path, monkeypatch, capfd):
    import types

    from sprite.runtime.ckpt import seal as ckpt_seal

    monkeypatch.setattr(ckpt_seal, "describe_mine", lambda *a, **k: (False, "rank 0: disk full", []))
    trainer = types.SimpleNamespace(strategy=_Strategy(), global_step=6, current_epoch=0, world_size=1, global_rank=0)
    old, new = tmp_path / "epoch=0-step=3.ckpt", tmp_path / "epoch=0-step=6.ckpt"
    old.write_bytes(b"old")
    ckpt_seal.save_checkpoint(lambda *a: new.write_bytes(b"new"), trainer, new)
    durable.remove_later(old, lambda: os.unlink(old))  # what ModelCheckpoint asks right after the save
    assert durable.drain(60) and old.exists()
    err = capfd.readouterr().err
    assert "is not sealed (a rank could not confirm its files): rank 0: disk full" in err and "kept" in err


def test_a_new_folder_checkpoint_and_its_entry_in_the_parent_are_fsynced_in_the_background(tmp_path, monkeypatch):
    import types

    from sprite import integrity
    from sprite.runtime.ckpt import seal as ckpt_seal

    monkeypatch.delenv("SPRITE_RUN_DIR", raising=False)
    strategy = _Strategy()
    strategy._save_distributed_checkpoint = True
    trainer = types.SimpleNamespace(strategy=strategy, global_step=3, current_epoch=0, world_size=1, global_rank=0)
    target = tmp_path / "epoch=0-step=3.ckpt"
    synced, fsync = [], os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append((threading.current_thread().name, os.readlink(
        f"/proc/self/fd/{fd}"))), fsync(fd))[1])

    def save(_trainer, path, _weights_only, _options):
        for name in (".metadata", "__0_0.distcp"):  # .metadata: a pickle, as verification requires
            (Path(path) / name).write_bytes(pickle.dumps(b"shard") if name == ".metadata" else b"shard")

    ckpt_seal.save_checkpoint(save, trainer, target)
    assert durable.drain(60) and integrity.verify(target).valid
    assert {name for name, _ in synced} == {"sprite-durable"}, synced
    assert {str(target / ".metadata"), str(target / "__0_0.distcp"), str(target), str(tmp_path)} <= {
        path for _, path in synced}


def test_a_forked_child_does_not_wait_on_its_parents_thread():
    durable.later(lambda: None)  # the parent's thread exists
    pid = os.fork()
    if pid == 0:  # a DataLoader worker, say: nothing queued here, so draining returns at once
        os._exit(0 if durable.drain(5) and durable._thread is None else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_sprites_sharded_writer_replaces_lightnings_and_leaves_the_fsync_to_the_seal(tmp_path, monkeypatch):
    import warnings

    import torch
    from lightning.pytorch.strategies import fsdp, model_parallel

    hashed_save.install()
    assert model_parallel._distributed_checkpoint_save is hashed_save.dcp_save
    assert fsdp._distributed_checkpoint_save is hashed_save.dcp_save
    synced, fsync = [], os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), fsync(fd))[1])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "assuming the intent is to save in a single process"
        hashed_save.dcp_save({"w": torch.arange(10.0)}, tmp_path / "ckpt")
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == [".metadata", "__0_0.distcp"] and not synced


def test_the_end_of_a_script_waits_for_the_background_thread(tmp_path):
    import subprocess
    import sys

    done = tmp_path / "done"
    script = tmp_path / "script.py"
    script.write_text("import time\nfrom sprite.runtime.ckpt import durable\n"
                      f"durable.later(lambda: (time.sleep(1), open({str(done)!r}, 'w').write('on disk')))\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPRITE_")}
    run = subprocess.run([sys.executable, "-m", "sprite.runtime", str(script)], env=env, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert done.read_text() == "on disk"


def test_a_rank_whose_fsync_failed_tells_the_others_through_the_store(tmp_path, monkeypatch, capfd):
    from torch.distributed import TCPStore

    store = TCPStore("127.0.0.1", 0, 2, True, wait_for_workers=False)
    monkeypatch.setattr(durable, "_store", lambda: (store, 2))
    monkeypatch.setattr(durable, "_failed", [])
    durable.saved([str(tmp_path / "missing.distcp")])  # this rank's fsync fails: the file is not there
    assert durable.drain(60)
    save = durable._saves
    assert store.add(durable._key(save), 0) == 1 and store.add(durable._key(save) + "/failed", 0) == 1
    monkeypatch.setattr(durable, "_failed", [])  # another rank's view: its own fsyncs went well
    store.add(durable._key(save), 1)
    old = tmp_path / "old.ckpt"
    old.write_bytes(b"old")
    durable.remove_later(old, lambda: os.unlink(old))
    assert durable.drain(60) and old.exists()
    assert "not every rank confirmed that the newer checkpoint is on disk" in capfd.readouterr().err


def test_the_checkpoint_benchmark_refuses_a_zero_repeat_count_in_one_line():
    import subprocess
    import sys

    script = Path(__file__).resolve().parent.parent / "benchmarks" / "checkpoint_io.py"
    run = subprocess.run([sys.executable, str(script), "--repeats", "0"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert run.stderr.splitlines()[-1] == "checkpoint_io.py: error: --repeats and --devices must be 1 or more"
