"""Checkpoints written by earlier sprite versions still load: tests/data/dcp_v1 holds a sealed sharded checkpoint
written by sprite's own hand-written writer (before issue 26 moved sprite to torch's FileSystemWriter). torch's
reader, sprite's reader, `sprite ckpt consolidate` and `--resume` read it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from sprite import integrity
from conftest import sprite_free_env

FIXTURE = Path(__file__).resolve().parent / "data" / "dcp_v1" / "epoch=0-step=3.ckpt"
SCRIPT = str(Path(__file__).resolve().parent / "scripts" / "ckpt_fit.py")
STRIP = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "NODE_RANK", "PBS_JOBID", "SLURM_JOB_ID")


@pytest.fixture
def old(tmp_path) -> Path:
    copy = tmp_path / "ck" / FIXTURE.name
    shutil.copytree(FIXTURE, copy)
    return copy


def test_the_old_format_still_verifies(old):
    verdict = integrity.verify(old)
    assert verdict.valid, verdict.reason
    assert verdict.manifest["meta"]["format"] == "dcp" and verdict.manifest["meta"]["step"] == 3


def test_torchs_reader_and_sprites_consolidate_read_the_old_format_alike(old, tmp_path):
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    from sprite.runtime.ckpt.consolidate import consolidate

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp_to_torch_save(old, tmp_path / "by_torch.pt")
        done = consolidate(old, tmp_path / "by_sprite.ckpt")
    assert done["source_sealed"]
    by_torch = torch.load(tmp_path / "by_torch.pt", weights_only=False)
    by_sprite = torch.load(tmp_path / "by_sprite.ckpt", weights_only=False)
    model = by_torch["state_dict"] if "state_dict" in by_torch else by_torch["model"]
    theirs = by_sprite["state_dict"]
    assert set(theirs) and all(torch.equal(theirs[key], model[key]) for key in theirs if key in model)
    assert any(key in model for key in theirs)


@pytest.mark.slow
def test_resume_loads_the_old_format_and_trains_on(old, sprite_cmd, tmp_path):
    env = sprite_free_env(STRIP)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    result = subprocess.run([*sprite_cmd, "run", "--devices", "2", "--strategy", "fsdp", "--resume", str(old),
                             SCRIPT, "--out", str(tmp_path), "--tag", "r", "--ckpt-dir", str(tmp_path / "new"),
                             "--max-steps", "6", "--random-sampler"], cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=400)
    log = result.stdout + result.stderr
    assert result.returncode == 0, log[-3000:]
    assert f"resume: from {old} (step 3, epoch 0)" in log
    assert integrity.verify(tmp_path / "new" / "epoch=0-step=6.ckpt").valid  # saved anew, by torch's writer
