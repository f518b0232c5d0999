"""Arm namespaces: no overwrite (partial or complete), manifest sealing, launch overrides. No processes."""

from __future__ import annotations

import numpy as np
import pytest

from sprite import integrity
from sprite.parity import store
from sprite.parity.launch import arm_overrides
from sprite.parity.settings import Settings


def _sealed(arm_dir):
    store.claim(arm_dir, 0)
    store.write_rank(arm_dir, 0, {"steps": [], "loss": float("nan")})
    store.write_tensors(arm_dir, {"init/w": np.ones(3, dtype=np.float32)})
    store.seal(arm_dir, 1)


def test_sealed_arm_loads_and_is_nan_free(tmp_path):
    _sealed(tmp_path / "ref")
    arm = store.load_arm(tmp_path / "ref")
    assert arm["ranks"][0]["loss"] is None and arm["tensors"]["init/w"].tolist() == [1, 1, 1]
    modes = {path.name: path.stat().st_mode & 0o777 for path in (tmp_path / "ref").iterdir()}
    assert modes == {"rank0.json": 0o600, "tensors.npz": 0o600, "sprite-manifest.json": 0o600}
    (tmp_path / "ref" / "stray.txt").write_text("")
    with pytest.raises(store.ResultError, match="stray.txt is not listed"):
        store.load_arm(tmp_path / "ref")


def test_an_arm_refuses_to_overwrite_complete_or_partial_results(tmp_path):
    _sealed(tmp_path / "ref")
    with pytest.raises(store.ResultError, match="refusing to overwrite"):
        store.claim(tmp_path / "ref", 0)
    partial = tmp_path / "ddp"
    store.claim(partial, 1)
    store.write_rank(partial, 1, {"steps": []})
    with pytest.raises(store.ResultError, match="rank1.json already exists"):
        store.claim(partial, 1)
    with pytest.raises(store.ResultError):
        store.write_rank(partial, 1, {"steps": [1]})


def test_unsealed_or_edited_arm_is_rejected_with_a_clear_message(tmp_path):
    _sealed(tmp_path / "ref")
    (tmp_path / "ref" / "rank0.json").write_text('{"steps": [], "loss": 0.5}')
    with pytest.raises(store.ResultError, match="rank0.json is missing or does not match the sha256"):
        store.load_arm(tmp_path / "ref")
    integrity.manifest_path(tmp_path / "ref").unlink()
    with pytest.raises(store.ResultError, match="did not finish"):
        store.load_arm(tmp_path / "ref")


def test_arms_launch_through_sprite_plans_with_their_own_world(tmp_path):
    settings = Settings(precision="bf16-mixed", devices=3)
    ddp = arm_overrides(tmp_path, "ddp", "skip-update", settings)
    split = arm_overrides(tmp_path, "split", None, settings)
    assert (ddp["devices"], ddp["strategy"], ddp["precision"]) == (3, "ddp", "bf16-mixed")
    assert ddp["args"][-2:] == ["--fault", "skip-update"] and ddp["script"].endswith("arm.py")
    assert (split["devices"], split["nodes"], split["strategy"]) == (1, 1, "single")


def test_a_world_that_cannot_be_planned_is_refused_before_anything_is_written(tmp_path, monkeypatch):
    from sprite.errors import UsageError
    from sprite.parity.check.runner import claim_dir

    for name in ("PBS_JOBID", "PBS_NODEFILE", "SLURM_JOB_ID", "SLURM_JOB_NODELIST"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(UsageError):
        claim_dir(tmp_path / "out", Settings(devices=2, nodes=2))
    assert not (tmp_path / "out").exists()


def test_single_device_arms_use_the_runtime_device_table():
    import torch

    from sprite.errors import UsageError
    from sprite.parity.recipe import pick_device
    from sprite.runtime.devices import device_type

    assert pick_device("auto").type == device_type("auto").name  # the row the ddp/fsdp arms' runtime picks
    assert pick_device("cpu") == torch.device("cpu")
    if not torch.cuda.is_available():
        with pytest.raises(UsageError, match="sees no cuda device"):
            pick_device("cuda")
