"""Arm namespaces: no overwrite (partial or complete), manifest sealing, launch overrides, and the launch fields
and settings files the three harnesses share. No processes."""

from __future__ import annotations

import dataclasses
import json
import os

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


def test_single_device_arms_use_the_runtime_device_table(monkeypatch):
    """pick_device follows sprite's device table and its preference: with a FAKE xpu row that says it is
    available (this machine has none), "auto" picks xpu; with the row unavailable, the next that is."""
    import torch

    from sprite.errors import UsageError
    from sprite.parity.recipe import pick_device
    from sprite.runtime import devices

    class Available:
        name = "xpu"

        def is_available(self):
            return True

    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert pick_device("auto") == torch.device(expected) and pick_device("cpu") == torch.device("cpu")
    monkeypatch.setitem(devices.DEVICE_TABLE, "xpu", Available())
    assert pick_device("auto") == torch.device("xpu") and pick_device("xpu") == torch.device("xpu")
    monkeypatch.undo()
    if not torch.cuda.is_available():
        with pytest.raises(UsageError, match="sees no cuda device"):
            pick_device("cuda")
    with pytest.raises(UsageError, match="Unknown accelerator 'tpu'"):
        pick_device("tpu")


def test_a_checks_sealed_settings_are_read_only_by_that_check_and_an_edit_fails_the_compare(tmp_path):
    """parity's and ckpt-check's run.json are sealed as the check starts (store.write_settings): a fault taken out
    of parity's settings after the run (its report would be skipped) fails the compare (exit 1); each check refuses
    the other's folder and an unsealed one (exit 2)."""
    from sprite import integrity
    from sprite.errors import UsageError
    from sprite.parity import store
    from sprite.parity.check import compare
    from sprite.parity.check.runner import claim_dir
    from sprite.parity.ckpt import compare as ckpt_compare
    from sprite.parity.ckpt.runner import claim_dir as claim_ckpt
    from sprite.parity.ckpt.settings import CkptSettings

    parity, ckpt = tmp_path / "parity", tmp_path / "ckpt"
    settings = Settings(precision="bf16-mixed", faults=("wrong-scale",))
    claim_dir(parity, settings)
    claim_ckpt(ckpt, CkptSettings())
    assert compare.load_settings(parity) == settings and ckpt_compare.load_settings(ckpt) == CkptSettings()
    with pytest.raises(UsageError, match="holds the settings of 'sprite ckpt-check settings', not of 'sprite parity"):
        compare.load_settings(ckpt)
    with pytest.raises(UsageError, match="holds the settings of 'sprite parity settings', not of 'sprite ckpt-check"):
        ckpt_compare.load_settings(parity)
    path = parity / "run.json"
    edited = {**json.loads(path.read_text()), "faults": []}
    os.chmod(path, 0o600)
    path.write_text(json.dumps(edited))
    with pytest.raises(store.ResultError, match="run.json is not valid: .*It was changed after the run") as err:
        compare.compare(parity, into=False)
    assert err.value.exit_code == 1
    os.unlink(integrity.manifest_path(path))  # the manifest removed too: not a parity run (exit 2)
    with pytest.raises(UsageError, match="has no manifest, so .* cannot be compared as a `sprite parity` run") as err:
        compare.load_settings(parity)
    assert err.value.exit_code == 2
    with pytest.raises(UsageError, match="holds no run.json"):
        compare.load_settings(tmp_path)


def test_the_three_harnesses_launch_their_workers_with_the_same_fields(tmp_path, monkeypatch):
    """parity/launch.py's job_fields: every worker runs offline and unbuffered; its CPU threads capped unless set."""
    from sprite.parity.bench.runner import plan_arm
    from sprite.parity.bench.settings import BenchSettings
    from sprite.parity.ckpt.roles import launches
    from sprite.parity.ckpt.runner import overrides
    from sprite.parity.ckpt.settings import CkptSettings

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    fit = next(item for item in launches(CkptSettings()) if item.key == "single-fit")
    ckpt = overrides(tmp_path, fit, CkptSettings(), threads=3)
    parity = arm_overrides(tmp_path, "ref", None, Settings(), threads=3)
    for fields in (ckpt, parity):
        assert fields["env"] == {"HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "3"}
    assert ckpt["args"] == ["--out", str(tmp_path), "--launch", "single-fit"] and ckpt["script"].endswith("worker.py")
    bench = plan_arm(tmp_path, BenchSettings(), 1, "raw", 0, {"PATH": os.environ["PATH"]})
    assert bench.env["HF_HUB_OFFLINE"] == "1" and int(bench.env["OMP_NUM_THREADS"]) >= 1
    monkeypatch.setenv("OMP_NUM_THREADS", "5")  # the shell's own setting wins
    assert "OMP_NUM_THREADS" not in arm_overrides(tmp_path, "ref", None, Settings(), threads=3)["env"]


def test_settings_of_the_three_harnesses_go_to_json_and_back():
    from sprite.parity.bench.settings import BenchSettings
    from sprite.parity.ckpt.settings import CkptSettings

    for settings in (Settings(precision="bf16-mixed", faults=("wrong-scale",)), CkptSettings(devices=4),
                     BenchSettings(sweep=(1, 2), baselines=("raw",))):
        text = settings.to_json()
        assert text == json.dumps(dataclasses.asdict(settings), indent=2, sort_keys=True)  # the files' format
        assert type(settings).from_dict({**json.loads(text), "from_a_later_version": 1}) == settings
