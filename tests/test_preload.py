"""A single-file checkpoint is loaded while it is verified and handed to Lightning only if it verified."""

from __future__ import annotations

import os
import threading

import pytest
import torch

from sprite import integrity
from sprite.runtime import preload, shared_verify


def _sealed(path, state) -> None:
    torch.save(state, path)
    integrity.seal(path, {"step": 1})


def _strategy():
    from lightning.pytorch.strategies import SingleDeviceStrategy

    return SingleDeviceStrategy(device=torch.device("cpu"))


def test_the_load_runs_on_its_own_thread_while_the_checkpoint_is_verified(tmp_path, monkeypatch):
    path = tmp_path / "a.ckpt"
    _sealed(path, {"w": torch.arange(10.0), "step": 1})
    verifying, loading = threading.Event(), threading.Event()
    verify = shared_verify.verify

    def slow_verify(strategy, target):  # returns only once the load has started: they overlap, or this fails
        verifying.set()
        assert loading.wait(10), "the load did not start while the checkpoint was being verified"
        return verify(strategy, target)

    def load(target):
        loading.set()
        assert verifying.wait(10), "the checkpoint was not being verified while it was loaded"
        return {"loaded_on": threading.current_thread().name, **torch.load(target, weights_only=True)}

    monkeypatch.setattr(shared_verify, "verify", slow_verify)
    check = preload.Checker(_strategy(), load)
    assert check(path).valid
    loaded = check.take(os.path.join(tmp_path, ".", "a.ckpt"))  # the same file by another spelling
    assert loaded["loaded_on"].startswith("sprite-preload") and torch.equal(loaded["w"], torch.arange(10.0))
    assert check.take(path) is None  # handed over once


def test_what_was_loaded_of_a_checkpoint_that_does_not_verify_is_dropped(tmp_path):
    path = tmp_path / "a.ckpt"
    _sealed(path, {"w": torch.arange(1000.0)})
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 1  # torch.load may still read it; the digest does not match
    os.unlink(path)
    path.write_bytes(bytes(data))
    loads = []
    check = preload.Checker(_strategy(), lambda target: loads.append(target) or {"anything": 1})
    verdict = check(path)
    assert not verdict.valid and "SHA-256" in verdict.reason
    assert loads == [str(path)] and check.take(path) is None
    failing = preload.Checker(_strategy(), lambda target: 1 / 0)  # a failed load: Lightning loads it itself
    _sealed(tmp_path / "b.ckpt", {"w": 1})
    assert failing(tmp_path / "b.ckpt").valid and failing.take(tmp_path / "b.ckpt") is None


def test_folders_are_verified_first_and_not_preloaded(tmp_path):
    folder = tmp_path / "dcp"
    folder.mkdir()
    (folder / "__0_0.distcp").write_bytes(b"x" * 100)
    integrity.seal(folder, {"step": 1})
    loads = []
    check = preload.Checker(_strategy(), loads.append)
    assert check(folder).valid and loads == [] and check.take(folder) is None


def test_only_strategies_that_load_through_torch_checkpoint_io_are_preloaded():
    from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
    from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy, ModelParallelStrategy

    from sprite.runtime.ddp import XPUDDPStrategy

    assert preload.loader(_strategy(), True) is not None
    assert preload.loader(DDPStrategy(), None) is not None
    assert preload.loader(XPUDDPStrategy(), None) is not None
    assert preload.loader(ModelParallelStrategy(), None) is None  # loads into the set-up model, with collectives
    assert preload.loader(FSDPStrategy(), None) is None

    class OwnIO(TorchCheckpointIO):
        pass

    assert preload.loader(_strategy().__class__(device=torch.device("cpu"), checkpoint_io=OwnIO()), None) is None


def test_lightning_is_handed_the_preloaded_checkpoint_once_then_loads_itself(tmp_path):
    path, other = tmp_path / "a.ckpt", tmp_path / "b.ckpt"
    torch.save({"from": "disk"}, path)
    torch.save({"from": "other"}, other)
    strategy = _strategy()
    with preload.handed_over(strategy, path, {"from": "preload"}):
        assert strategy.load_checkpoint(other, weights_only=True) == {"from": "other"}
        assert strategy.load_checkpoint(str(path), weights_only=True) == {"from": "preload"}
        assert strategy.load_checkpoint(path, weights_only=True) == {"from": "disk"}
    assert "load_checkpoint" not in vars(strategy)
    with pytest.raises(RuntimeError), preload.handed_over(strategy, path, {"from": "preload"}):
        raise RuntimeError("the resume failed")
    assert "load_checkpoint" not in vars(strategy)
    with preload.handed_over(strategy, path, None):  # nothing preloaded: Lightning's own load
        assert strategy.load_checkpoint(path, weights_only=True) == {"from": "disk"}
