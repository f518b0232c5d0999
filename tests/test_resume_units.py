"""Resume pieces in one process: where --resume auto looks, the ckpt_path conflict, the generators' round trip."""

from __future__ import annotations

import pickle
import random

import numpy as np
import pytest
import torch

from sprite.errors import UsageError
from sprite.runtime.ckpt import resume
from sprite.runtime.ckpt import rng_state


def _trainer(tmp_path, **kwargs):
    import lightning as L

    return L.Trainer(default_root_dir=str(tmp_path), enable_progress_bar=False, enable_model_summary=False, **kwargs)


def test_auto_looks_in_dirpath_every_logger_version_or_the_default_root(tmp_path):
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.loggers import CSVLogger

    explicit = _trainer(tmp_path, logger=False, callbacks=[ModelCheckpoint(dirpath=tmp_path / "mine")])
    assert resume.checkpoint_dirs(explicit) == [str(tmp_path / "mine")]
    for version in ("version_0", "version_1", "run-b"):
        (tmp_path / "logs" / "exp" / version / "checkpoints").mkdir(parents=True)
    logged = _trainer(tmp_path, logger=CSVLogger(tmp_path / "logs", name="exp"))
    assert resume.checkpoint_dirs(logged) == [str(tmp_path / "logs" / "exp" / v / "checkpoints")
                                               for v in ("run-b", "version_0", "version_1")]
    assert resume.checkpoint_dirs(_trainer(tmp_path, logger=False)) == [str(tmp_path / "checkpoints")]
    # no ModelCheckpoint: where a preemption save goes (sprite/runtime/preempt.py)
    assert resume.checkpoint_dirs(_trainer(tmp_path, logger=False, enable_checkpointing=False)) == [
        str(tmp_path / "checkpoints")]


def test_a_script_that_picks_its_own_checkpoint_conflicts_with_resume(tmp_path, monkeypatch):
    from lightning.pytorch import Trainer
    from lightning.pytorch.trainer.connectors.checkpoint_connector import _CheckpointConnector

    monkeypatch.setattr(Trainer, "fit", Trainer.fit)  # restored after the test
    monkeypatch.setattr(_CheckpointConnector, "resume_start", _CheckpointConnector.resume_start)
    resume.install("auto")
    with pytest.raises(UsageError, match=r"Trainer.fit\(ckpt_path='mine.ckpt'\) and sprite was asked to resume"):
        _trainer(tmp_path, logger=False).fit(None, ckpt_path="mine.ckpt")
    assert resume.mode({}) == "never" and resume.mode({"SPRITE_RESUME": " auto "}) == "auto"


def test_each_trainers_first_fit_is_resumed_and_no_later_fit_of_it(tmp_path, monkeypatch):
    """docs/checkpoints.md: --resume hands the checkpoint to each Trainer's first fit (a script of two stages, or a
    warm pool's next role, makes a Trainer of its own), never to a later fit of the same Trainer."""
    from lightning.pytorch import Trainer
    from lightning.pytorch.trainer.connectors.checkpoint_connector import _CheckpointConnector

    fits = []
    monkeypatch.setattr(Trainer, "fit", lambda self, *args, **kwargs: fits.append((self, kwargs.get("ckpt_path"))))
    monkeypatch.setattr(_CheckpointConnector, "resume_start", _CheckpointConnector.resume_start)
    resume.install("auto")
    first, second = _trainer(tmp_path, logger=False), _trainer(tmp_path, logger=False)
    first.fit(None)
    first.fit(None)
    second.fit(None)
    first.fit(None, ckpt_path="mine.ckpt")  # a later fit may name its own checkpoint
    assert fits == [(first, resume.PENDING), (first, None), (second, resume.PENDING), (first, "mine.ckpt")]


def test_every_generator_comes_back(tmp_path):
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    saved = rng_state.capture("cpu")
    torch.save(saved, tmp_path / "state.pt")
    first = (random.random(), np.random.rand(), torch.rand(3))
    rng_state.restore(torch.load(tmp_path / "state.pt", weights_only=True), "cpu")  # safe to load as weights
    again = (random.random(), np.random.rand(), torch.rand(3))
    assert first[:2] == again[:2] and torch.equal(first[2], again[2])


class _Rank0:
    """Stands in for a Lightning strategy on rank 0 of a world of one (a named fake: no process group)."""

    is_global_zero = True

    def broadcast(self, obj):
        return obj


def test_an_invalid_resume_path_ends_every_rank_with_exit_1(tmp_path):
    from sprite import integrity

    path = tmp_path / "epoch=0-step=3.ckpt"
    integrity.write_new(path, b"weights")
    integrity.seal(path, {"step": 3, "epoch": 0})
    trainer = type("Trainer", (), {"strategy": _Rank0()})()
    assert resume.resolve(trainer, str(path)) == (str(path), None)  # a file: verified whole first
    path.write_bytes(b"WEIGHTS")
    with pytest.raises(integrity.IntegrityError, match="not valid: .*does not match its SHA-256") as err:
        resume.resolve(trainer, str(path))
    assert err.value.exit_code == 1


def _augmenting_loader():
    """Batches whose content draws from the global torch generator, as random augmentation does."""
    while True:
        yield torch.rand(2)


def test_a_prefetched_batch_is_drawn_again_from_its_own_state():
    """Fetch 1 is trained, fetch 2 was prefetched before the save: the resume skips 1, re-draws 2 from the
    state before it, then continues from the state at the save (dropout draws interleave with fetches)."""
    torch.manual_seed(0)
    start = rng_state.capture("cpu")
    original = rng_state._Counted(_augmenting_loader(), "cpu", None)
    first, prefetched = next(original), next(original)
    torch.rand(3)  # step 1's dropout, after the prefetch
    saved = {"trained": 1, "before": [s for n, s in original.before if n > 1], "now": rng_state.capture("cpu")}
    later = [(next(original), torch.rand(3)) for _ in range(2)]
    rng_state.restore(start, "cpu")
    torch.rand(5)  # draws before the skip change only the dropped batch 1 here (no sampler)
    resumed = rng_state._Counted(_augmenting_loader(), "cpu", saved)
    assert torch.equal(next(resumed), prefetched)
    again = [(next(resumed), torch.rand(3)) for _ in range(2)]
    assert all(torch.equal(a, b) and torch.equal(c, d) for (a, c), (b, d) in zip(later, again))
    assert not torch.equal(first, prefetched)


def _sealed_folder(path, step: int):
    from sprite import integrity

    path.mkdir(parents=True)
    for name, size in ((".metadata", 50), ("__0_0.distcp", 5000), ("meta.pt", 30)):
        data = bytes([step]) * size
        (path / name).write_bytes(pickle.dumps(data) if name == ".metadata" else data)  # .metadata: a pickle
    integrity.seal(path, {"step": step, "epoch": 0})
    return path


def _flip(path):
    import os

    data = bytearray(path.read_bytes())
    os.unlink(path)
    data[len(data) // 2] ^= 1
    path.write_bytes(bytes(data))  # same size: only its SHA-256 tells


class _Connector:
    """Stands in for Lightning's _CheckpointConnector (a named fake): ``load`` is its resume_start."""

    def __init__(self, tmp_path):
        self.trainer = type("Trainer", (), {"strategy": _Rank0(), "checkpoint_callbacks": [],
                                            "default_root_dir": str(tmp_path)})()
        self.loads = []

    def load(self, connector, path, weights_only, fail=None):
        self.loads.append(path)
        if fail:
            raise fail
        return "loaded"


def test_a_sharded_checkpoint_loads_while_its_shard_files_are_hashed(tmp_path, monkeypatch):
    from sprite.runtime.ckpt import shared_verify

    folder = _sealed_folder(tmp_path / "epoch=0-step=6.ckpt", 6)
    hashing_during_load = []
    connector = _Connector(tmp_path)
    real_start = shared_verify.start
    monkeypatch.setattr(shared_verify, "start", lambda *args, **kwargs: (
        hashing_during_load.append(kwargs.get("background")), real_start(*args, **kwargs))[1])
    assert resume._resume(connector.load, connector, str(folder), None) == "loaded"
    assert connector.loads == [str(folder)] and hashing_during_load == [True]


def test_a_sharded_checkpoint_found_changed_while_it_loaded_is_refused_with_exit_1(tmp_path):
    from sprite import integrity

    folder = _sealed_folder(tmp_path / "epoch=0-step=6.ckpt", 6)
    _flip(folder / "__0_0.distcp")
    connector = _Connector(tmp_path)
    with pytest.raises(integrity.IntegrityError, match="not valid: .*__0_0.distcp does not match") as err:
        resume._resume(connector.load, connector, str(folder), None)
    assert err.value.exit_code == 1 and connector.loads == [str(folder)]  # loaded, then refused


def test_resume_auto_loads_the_previous_checkpoint_over_one_found_changed_while_it_loaded(tmp_path, capfd):
    older = _sealed_folder(tmp_path / "checkpoints" / "epoch=0-step=3.ckpt", 3)
    newer = _sealed_folder(tmp_path / "checkpoints" / "epoch=0-step=6.ckpt", 6)
    _flip(newer / "__0_0.distcp")
    connector = _Connector(tmp_path)
    assert resume._resume(connector.load, connector, "auto", None) == "loaded"
    assert connector.loads == [str(newer), str(older)]
    err = capfd.readouterr().err
    assert f"resume: skipped {newer}" in err and "__0_0.distcp does not match its SHA-256" in err
    assert f"resume: from {older} (step 3, epoch 0)" in err and f"resume: from {newer}" not in err


def test_a_load_that_fails_is_blamed_on_the_checkpoint_only_when_it_does_not_verify(tmp_path):
    from functools import partial

    older = _sealed_folder(tmp_path / "checkpoints" / "epoch=0-step=3.ckpt", 3)
    newer = _sealed_folder(tmp_path / "checkpoints" / "epoch=0-step=6.ckpt", 6)
    connector = _Connector(tmp_path)
    with pytest.raises(RuntimeError, match="the model does not fit"):  # intact: the load's own error
        resume._resume(partial(connector.load, fail=RuntimeError("the model does not fit")), connector, "auto", None)
    _flip(newer / "__0_0.distcp")
    connector = _Connector(tmp_path)
    failing_once = lambda conn, path, weights: connector.load(  # noqa: E731
        conn, path, weights, fail=RuntimeError("bad zip") if path == str(newer) else None)
    assert resume._resume(failing_once, connector, "auto", None) == "loaded"
    assert connector.loads == [str(newer), str(older)]


@pytest.mark.parametrize("wanted", ["auto", "/ck/last.ckpt"])
def test_a_script_asking_for_weights_only_false_is_refused_before_any_checkpoint_is_looked_at(monkeypatch, wanted):
    """Under --resume auto the first attempt may find nothing to load, but the relaunch after a preemption would:
    refused at once, on every rank alike, before anything is hashed."""
    from types import SimpleNamespace

    from sprite.errors import UsageError
    from sprite.runtime.ckpt import resume

    monkeypatch.setattr(resume, "resolve", lambda *a, **k: pytest.fail("looked for a checkpoint first"))
    with pytest.raises(UsageError, match=r"Trainer.fit\(weights_only=False\) under --resume"):
        resume._resume(lambda *a: None, SimpleNamespace(trainer=None), wanted, False)
    loaded = []
    monkeypatch.setattr(resume, "resolve", lambda trainer, w, rejected: ("/ck/x.ckpt", None))
    resume._resume(lambda connector, path, weights_only: loaded.append(weights_only), SimpleNamespace(trainer=None),
                   wanted, None)
    assert loaded == [True]  # given outright, whatever torch's default or environment says
