"""The background side of checkpointing (sprite.runtime.ckpt.durable, seal._complete): one save in flight a rank,
the checkpoint it supersedes removed only after it is sealed, and a failure that keeps the older checkpoint and
stops the run in one line."""

from __future__ import annotations

import os
import threading
import warnings
from pathlib import Path

import pytest

from sprite import integrity
from sprite.runtime.ckpt import durable
from sprite.runtime.ckpt import save as hashed_save
from sprite.runtime.ckpt import seal
from conftest import sprite_free_env


@pytest.fixture(autouse=True)
def _clean(monkeypatch):
    monkeypatch.setattr(durable, "_failed", [])
    monkeypatch.setattr(durable, "_unsealed", [False])
    yield
    assert durable.drain(60)


def _save_file(state: dict, target: Path, pending_hook=None) -> None:
    """What seal.save_checkpoint does for a one-rank full-state save, without a Trainer."""
    durable.wait()
    with hashed_save.collecting() as pending:
        hashed_save.atomic_save(state, target)
    if pending_hook:
        pending_hook(pending)
    plan = {"write": str(target), "swap": False, "folder": False}
    durable.later(lambda: seal._complete(plan, target, {"step": 1}, pending, 0, 1, None))


def test_a_save_returns_before_its_write_and_the_older_checkpoint_goes_after_the_seal(tmp_path):
    gate = threading.Event()
    old, new = tmp_path / "epoch=0.ckpt", tmp_path / "epoch=1.ckpt"
    old.write_bytes(b"an older checkpoint")
    durable.later(lambda: gate.wait(60))  # the background thread is busy: the write waits behind it
    state = {"w": __import__("torch").arange(4.0)}
    with hashed_save.collecting() as pending:
        hashed_save.atomic_save(state, new)
    state["w"].add_(1)  # the training loop goes on: the staged copy is what is written
    plan = {"write": str(new), "swap": False, "folder": False}
    durable.later(lambda: seal._complete(plan, new, {"step": 1}, pending, 0, 1, None))
    removed = threading.Event()
    durable.remove_later(old, lambda: (os.unlink(old), removed.set()))
    assert not new.exists() and not removed.wait(0.3) and old.exists()
    gate.set()
    assert durable.drain(60) and removed.is_set() and not old.exists()
    assert integrity.verify(new).valid
    import torch

    assert torch.equal(torch.load(new, weights_only=True)["w"], torch.arange(4.0))


def test_the_next_save_waits_for_the_one_in_flight(tmp_path):
    gate, order = threading.Event(), []
    durable.later(lambda: (gate.wait(60), order.append("in flight")))
    waiter = threading.Thread(target=lambda: (durable.wait(), order.append("next save")))
    waiter.start()
    waiter.join(0.3)
    assert waiter.is_alive() and not order
    gate.set()
    waiter.join(60)
    assert order == ["in flight", "next save"]


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


def test_a_failed_background_write_keeps_the_older_checkpoint_and_stops_the_next_save(tmp_path, monkeypatch,
                                                                                      capfd):
    old, new = tmp_path / "epoch=0.ckpt", tmp_path / "epoch=1.ckpt"
    old.write_bytes(b"an older checkpoint")

    def full(pending):
        def run():
            raise OSError(28, "No space left on device")
        pending[0].run = run

    _save_file({"w": 1}, new, full)
    durable.remove_later(old, lambda: os.unlink(old))
    assert durable.drain(60) and old.exists() and not new.exists()
    assert not [name for name in os.listdir(tmp_path) if "sprite-tmp" in name]
    with pytest.raises(durable.SaveFailed) as failed:
        durable.wait()
    message = str(failed.value)
    assert "No space left on device" in message and "previous checkpoint is kept" in message
    assert "\n" not in message and len(message) < 700
    err = capfd.readouterr().err
    assert "sprite: error:" in err and f"kept {old}" in err


def test_torchs_checkpoint_exception_fails_the_save_in_one_line_and_the_background_thread_lives_on(tmp_path,
                                                                                                    monkeypatch):
    """torch's CheckpointException is a BaseException, and its text is every rank's traceback. Raised by a write
    (here the first), or by any job, it fails the save like any error instead of ending the background thread,
    which a later drain() would wait on for ever (a sharded save that one rank could not write hung the run)."""
    import traceback

    from torch.distributed.checkpoint.api import CheckpointException

    full = OSError(28, "No space left on device")
    torchs = CheckpointException("CheckpointException ranks:dict_keys([1])", {1: (full, traceback.StackSummary())})
    assert hashed_save.torch_failures(torchs) == "rank 1: OSError: [Errno 28] No space left on device"

    def fails(pending):
        def run():
            raise torchs
        pending[0].run = run

    from sprite.runtime.ckpt import background

    told, gather = [], background.gather
    monkeypatch.setattr(background, "gather", lambda report, *args: (told.append(report), gather(report, *args))[1])
    _save_file({"w": 1}, tmp_path / "epoch=1.ckpt", fails)
    durable.later(lambda: (_ for _ in ()).throw(torchs))  # a job of its own, outside the seal
    assert durable.drain(60) and durable._thread.is_alive()
    assert not integrity.verify(tmp_path / "epoch=1.ckpt").valid
    with pytest.raises(durable.SaveFailed) as failed:
        durable.wait()
    assert "\n" not in str(failed.value) and "CheckpointException" in str(failed.value)
    assert len(durable._failed) == 2
    # the failed rank still told rank 0 (the other ranks wait for its word in that gather)
    assert len(told) == 1 and told[0][0] is False and "CheckpointException" in told[0][1]


def test_a_dead_checkpoint_process_is_named_with_the_thread_writer_as_the_fix_and_each_advice_given_once(capfd):
    """torch's words for its checkpoint process gone lead to that process and --checkpoint-writer thread, not to a
    full disk; a SaveFailed from the seal keeps one cause and one fix in the message check() raises."""
    def sealed_badly():
        raise durable.SaveFailed("Checkpoint /c was not saved: rank 0: RuntimeError: Checkpoint background process "
                                 "is dead. Exit code: 1.", *durable.advice("Checkpoint background process is dead"))

    durable.later(sealed_badly)
    assert durable.drain(60)
    with pytest.raises(durable.SaveFailed) as failed:
        durable.wait()
    message = str(failed.value)
    assert "torch's checkpoint process exited" in message and "--checkpoint-writer thread" in message
    assert "disk" not in message and message.count("previous checkpoint is kept") == 1
    assert "Exit code: 1." in message and ".." not in message and "\n" not in message
    assert "sprite: error: Checkpoint /c was not saved" in capfd.readouterr().err
    assert durable.advice("OSError: [Errno 28] No space left on device")[0].startswith("The disk may be full")


def test_an_unsealed_save_keeps_the_checkpoint_it_was_to_supersede(tmp_path, capfd):
    old = tmp_path / "epoch=0.ckpt"
    old.write_bytes(b"old")
    durable.outcome(False)
    durable.remove_later(old, lambda: os.unlink(old))
    assert durable.drain(60) and old.exists()
    assert "the newer checkpoint was not sealed" in capfd.readouterr().err


def test_a_save_replacing_a_file_of_the_same_name_swaps_it_in_only_when_sealed(tmp_path):
    target = tmp_path / "last.ckpt"
    _save_file({"w": 1}, target)
    assert durable.drain(60) and integrity.verify(target).valid
    gate = threading.Event()
    durable.later(lambda: gate.wait(60))
    with hashed_save.collecting() as pending:
        hashed_save.atomic_save({"w": 2}, target)
    plan = {"write": str(target), "swap": False, "folder": False}
    durable.later(lambda: seal._complete(plan, target, {"step": 2}, pending, 0, 1, None))
    assert integrity.verify(target).valid  # still the first, sealed, while the second waits
    gate.set()
    assert durable.drain(60)
    verdict = integrity.verify(target)
    assert verdict.valid and verdict.manifest["meta"]["step"] == 2


def test_a_folder_save_is_fsynced_before_its_manifest(tmp_path, monkeypatch):
    import torch

    events, fsync_file, fsync_dir, real_seal = [], integrity.fsync_file, integrity.fsync_dir, integrity.seal
    monkeypatch.setattr(integrity, "fsync_file", lambda path: (events.append(("file", Path(path).name)),
                                                               fsync_file(path))[1])
    monkeypatch.setattr(integrity, "fsync_dir", lambda path: (events.append(("dir", Path(path).name)),
                                                              fsync_dir(path))[1])
    monkeypatch.setattr(integrity, "seal", lambda *a, **k: (events.append(("seal", k.get("sync"))),
                                                            real_seal(*a, **k))[1])
    monkeypatch.setattr(hashed_save, "_stagers", {})
    folder = tmp_path / "step=1.ckpt"
    folder.mkdir()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "assuming the intent is to save in a single process"
        with hashed_save.collecting() as pending:
            hashed_save.dcp_save({"w": torch.arange(10.0)}, folder)
        plan = {"write": str(folder), "swap": False, "folder": True}
        durable.later(lambda: seal._complete(plan, folder, {"step": 1}, pending, 0, 1, None))
        assert durable.drain(60)
    assert integrity.verify(folder).valid
    at = events.index(("seal", True))
    assert {("file", ".metadata"), ("file", "__0_0.distcp"), ("dir", folder.name)} <= set(events[:at])


def test_a_forked_child_does_not_wait_on_its_parents_thread():
    durable.later(lambda: None)  # the parent's thread exists
    pid = os.fork()
    if pid == 0:  # a DataLoader worker, say: nothing queued here, so draining returns at once
        os._exit(0 if durable.drain(5) and durable._thread is None else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


def test_sprites_sharded_save_replaces_lightnings_and_leaves_the_fsync_to_the_seal(tmp_path, monkeypatch):
    import torch
    from lightning.pytorch.strategies import fsdp, model_parallel

    hashed_save.install()
    assert model_parallel._distributed_checkpoint_save is hashed_save.dcp_save
    assert fsdp._distributed_checkpoint_save is hashed_save.dcp_save
    synced, fsync = [], os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(fd), fsync(fd))[1])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hashed_save.dcp_save({"w": torch.arange(10.0)}, tmp_path / "ckpt")
    assert {".metadata", "__0_0.distcp"} <= {p.name for p in (tmp_path / "ckpt").iterdir()} and not synced


def test_the_end_of_a_script_waits_for_the_background_thread(tmp_path):
    import subprocess
    import sys

    done = tmp_path / "done"
    script = tmp_path / "script.py"
    script.write_text("import time\nfrom sprite.runtime.ckpt import durable\n"
                      f"durable.later(lambda: (time.sleep(1), open({str(done)!r}, 'w').write('on disk')))\n")
    env = sprite_free_env()
    run = subprocess.run([sys.executable, "-m", "sprite.runtime", str(script)], env=env, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert done.read_text() == "on disk"


@pytest.mark.parametrize("name, bad", [*[("checkpoint_io.py", bad) for bad in (
    ["--repeats", "0"], ["--threads", "-1"], ["--switch-interval", "-0.001"],
    ["--shared-buffers", "--modes", "process"], ["--switch-interval", "5"],
    ["--buffer-per-tensor", "--modes", "thread"], ["--hash-threads", "-2"])],
    ("shared_send.py", ["--tensors", "0"]), ("shared_send.py", ["--sends", "-1"]),
    *[("hash_beside.py", bad) for bad in (["--threads", "4,x"], ["--threads", "0"], ["--gib", "0"])]])
def test_the_checkpoint_benchmarks_refuse_a_bad_setting_in_one_line(name, bad):
    import subprocess
    import sys

    script = Path(__file__).resolve().parent.parent / "benchmarks" / name
    run = subprocess.run([sys.executable, str(script), *bad], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    assert run.stderr.strip().splitlines()[-1].startswith(f"{name}: error: "), run.stderr


def test_the_hashing_benchmark_prints_a_line_for_each_thread_count():
    """benchmarks/hash_beside.py end to end on a small file: the loop it times comes from shared_send.py beside it."""
    import re
    import subprocess
    import sys

    script = Path(__file__).resolve().parent.parent / "benchmarks" / "hash_beside.py"
    run = subprocess.run([sys.executable, str(script), "--gib", "0.02", "--repeats", "1", "--passes", "1",
                          "--steps", "20", "--threads", "2,1"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    rows = re.findall(r"^ +(\d+) threads: hash [\d.]+ s .* lost [\d.]+% of its speed, [\d.]+ ms a GiB hashed$",
                      run.stdout, re.M)
    assert rows == ["2", "1"], run.stdout


def test_background_saves_get_a_gloo_group_in_a_one_rank_world_too(tmp_path):
    """dcp.async_save refuses a default group without a CPU backend, as a 1-rank NCCL world has (seen on one
    H200 with torch 2.11): background saves use a gloo group of their own at every world size."""
    import torch.distributed as dist

    from sprite.runtime.ckpt import background

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    saved = list(background._group)
    background._group.clear()
    try:
        made = background.group()
        assert made is not None and dist.get_backend(made) == "gloo"
    finally:
        background._group[:] = saved
        dist.destroy_process_group()


@pytest.mark.parametrize("folder", [False, True], ids=["file", "folder"])
def test_a_save_replacing_one_of_the_same_name_that_cannot_be_sealed_leaves_the_old_one_valid(tmp_path, monkeypatch,
                                                                                              folder):
    """docs/checkpoints.md: a save replacing `last.ckpt` is sealed under a temporary name first, so a seal that
    fails (or a rank killed before the renames) leaves the old checkpoint whole and valid at its name; the error
    names rank 0's own failure. A folder save's old folder is not removed."""
    import torch

    monkeypatch.setattr(hashed_save, "_stagers", {})
    target = tmp_path / "last.ckpt"

    def save(step):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "assuming the intent is to save in a single process"
            plan = seal._plan(target, folder)
            with hashed_save.collecting() as pending:
                if folder:
                    hashed_save.dcp_save({"w": torch.full((4,), float(step))}, Path(plan["write"]))
                else:
                    hashed_save.atomic_save({"w": step}, target)
            plan["folder"] = folder
            durable.later(lambda: seal._complete(plan, target, {"step": step}, pending, 0, 1, None))
            assert durable.drain(60)

    save(1)
    assert integrity.verify(target).manifest["meta"]["step"] == 1
    real_seal = integrity.seal

    def seal_then_fail(where, *args, **kwargs):
        assert integrity.verify(target).manifest["meta"]["step"] == 1  # still the old one, sealed, at its name
        real_seal(where, *args, **kwargs)
        raise OSError(28, "No space left on device (injected after the manifest was written)")

    monkeypatch.setattr(integrity, "seal", seal_then_fail)
    save(2)
    verdict = integrity.verify(target)
    assert verdict.valid and verdict.manifest["meta"]["step"] == 1, verdict.reason
    with pytest.raises(durable.SaveFailed, match="rank 0 could not seal it: OSError"):
        durable.check()
    leftovers = [name for name in os.listdir(tmp_path) if name != target.name and name != target.name +
                 integrity.MANIFEST_SUFFIX]
    # a file's temporary copy and the manifest sealed beside it are removed; a folder's fresh copy stays hidden aside
    assert all("sprite-new" in name for name in leftovers) if folder else leftovers == [], leftovers
    monkeypatch.setattr(integrity, "seal", real_seal)
    durable._failed.clear()
    save(3)
    verdict = integrity.verify(target)
    assert verdict.valid and verdict.manifest["meta"]["step"] == 3, verdict.reason


def test_the_words_for_a_dead_checkpoint_process_are_torchs_own():
    """durable.PROCESS_GONE is matched against the installed torch's wording: a reword there would send users to
    the disk's advice instead of --checkpoint-writer thread, and fails here first."""
    import inspect

    from torch.distributed.checkpoint import _async_process_executor as executor

    assert durable.PROCESS_GONE in inspect.getsource(executor).lower(), "torch words its dead process otherwise"
