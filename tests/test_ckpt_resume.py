"""Checkpoint manifests and resume in real 2-rank gloo fits through `sprite run` (local launcher and MPICH mpiexec).

The fits are shared: DDP runs an uninterrupted fit, a fit whose rank 0 is SIGKILLed halfway through writing its
4th checkpoint, a `--resume auto` of it under mpiexec, a resume after a byte of the newest checkpoint was flipped,
and a resume where every checkpoint is corrupt; FSDP2 runs a sharded fit and a resume of it that saves full-state
files, with each rank's RandomSampler drawing its permutation from the global generator, and a resume after a byte
of rank 1's shard file was flipped in both of the newest sharded checkpoints. The script (tests/scripts/ckpt_fit.py) uses dropout and shuffled data and knows nothing about sprite.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from sprite import integrity
from sprite.integrity import audit
from conftest import sprite_free_env

pytestmark = pytest.mark.slow

SCRIPT = str(Path(__file__).resolve().parent / "scripts" / "ckpt_fit.py")
VENV_BIN = str(Path(sys.executable).parent)
STRIP = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "NODE_RANK", "PBS_JOBID", "SLURM_JOB_ID")


def fit(sprite_cmd, root: Path, tag: str, flags: list, ckpt: Path, *args) -> subprocess.CompletedProcess:
    env = sprite_free_env(STRIP)
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"  # the MPICH wheel's mpiexec
    cmd = [*sprite_cmd, "run", "--devices", "2", *flags, SCRIPT, "--out", str(root), "--tag", tag,
           "--ckpt-dir", str(ckpt), *args]
    result = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=400)
    (root / f"{tag}.log").write_text(result.stdout + result.stderr)
    return result


def losses(root: Path, tag: str, rank: int) -> dict:
    with open(root / f"losses-{tag}-rank{rank}.jsonl") as lines:
        return {record["step"]: record["loss"] for record in map(json.loads, lines)}


def weights(root: Path, tag: str) -> dict:
    import torch

    return torch.load(root / f"final-{tag}.pt")


@pytest.fixture(scope="module")
def ddp(sprite_cmd, tmp_path_factory):
    root = tmp_path_factory.mktemp("ddp")
    # Every sprite run has a run folder (SPRITE_RUN_DIR) and audit trail of its own: k's and r's are read in turn.
    runs = {"root": root, "ck": root / "ck", "audit": [root / f"run-{tag}" / "audit.jsonl" for tag in "kr"]}
    runs["u"] = fit(sprite_cmd, root, "u", ["--resume", "auto"], root / "u_ck")  # nothing to resume yet
    runs["k"] = fit(sprite_cmd, root, "k", ["--run-dir", str(root / "run-k")], runs["ck"], "--crash-at-save", "4")
    runs["k_dir"] = sorted(os.listdir(runs["ck"]))
    runs["r"] = fit(sprite_cmd, root, "r", ["--run-dir", str(root / "run-r"), "--launcher", "mpiexec", "--resume",
                                            "auto"], runs["ck"])
    newest = runs["ck"] / "epoch=2-step=18.ckpt"
    data = bytearray(newest.read_bytes())
    data[len(data) // 2] ^= 0x01
    newest.write_bytes(bytes(data))
    runs["f"] = fit(sprite_cmd, root, "f", ["--resume", "auto"], runs["ck"])
    bad = root / "bad_ck"
    bad.mkdir()
    for name in ("epoch=0-step=3.ckpt", "epoch=0-step=6.ckpt"):
        for suffix in ("", integrity.MANIFEST_SUFFIX):
            shutil.copy(root / "u_ck" / (name + suffix), bad / (name + suffix))
    os.truncate(bad / "epoch=0-step=3.ckpt", 100)
    (bad / "epoch=0-step=6.ckpt.sprite-manifest.json").write_text("{}")
    runs["x"] = fit(sprite_cmd, root, "x", ["--launcher", "mpiexec", "--resume", "auto"], bad)
    return runs


def test_a_rank_killed_while_writing_leaves_the_previous_checkpoint_valid(ddp, sprite_cmd):
    assert ddp["u"].returncode == 0, ddp["u"].stderr[-3000:]
    assert f"resume auto: no checkpoint in {ddp['root'] / 'u_ck'}; starting fresh" in ddp["u"].stdout + ddp["u"].stderr
    assert ddp["k"].returncode != 0
    assert "epoch=1-step=12.ckpt" in ddp["k_dir"] and "epoch=1-step=12.ckpt.sprite-manifest.json" not in ddp["k_dir"]
    previous = subprocess.run([*sprite_cmd, "ckpt", "verify", str(ddp["ck"] / "epoch=1-step=9.ckpt")],
                              capture_output=True, text=True, timeout=60)
    partial = subprocess.run([*sprite_cmd, "ckpt", "verify", str(ddp["ck"] / "epoch=1-step=12.ckpt")],
                             capture_output=True, text=True, timeout=60)
    assert previous.returncode == 0 and "step 9, epoch 1" in previous.stdout
    assert partial.returncode == 1 and "has no manifest" in partial.stderr


def test_resume_auto_skips_the_partial_save_and_continues_bit_for_bit(ddp):
    log = ddp["r"].stdout + ddp["r"].stderr
    assert ddp["r"].returncode == 0, log[-3000:]
    assert "resume: skipped" in log and "epoch=1-step=12.ckpt has no manifest" in log
    assert f"resume: from {ddp['ck'] / 'epoch=1-step=9.ckpt'} (step 9, epoch 1)" in log
    root = ddp["root"]
    for rank in (0, 1):
        uninterrupted = losses(root, "u", rank)
        killed, resumed = losses(root, "k", rank), losses(root, "r", rank)
        assert min(resumed) == 9 and max(resumed) == 19
        stitched = {**{s: v for s, v in killed.items() if s < 9}, **resumed}
        assert stitched == uninterrupted  # every step's loss, bit for bit (float.hex)
    final_u, final_r = weights(root, "u"), weights(root, "r")
    assert final_u.keys() == final_r.keys() and all((final_u[k] == final_r[k]).all() for k in final_u)


def test_ranks_audit_the_saves_the_skip_and_the_resume(ddp):
    trail = []
    for path in ddp["audit"]:
        ok, why = audit.verify(path)
        assert ok, why
        trail += [r for r in audit.read(path) if r["kind"] in ("checkpoint_written", "checkpoint_skipped", "resume")]
    records = [(r["kind"], Path(r["path"]).name, r.get("step")) for r in trail]
    assert records[:3] == [("checkpoint_written", f"epoch={e}-step={s}.ckpt", s) for e, s in ((0, 3), (0, 6), (1, 9))]
    assert records[3] == ("checkpoint_skipped", "epoch=1-step=12.ckpt", None)
    assert records[4] == ("resume", "epoch=1-step=9.ckpt", 9)
    assert ("checkpoint_written", "epoch=2-step=18.ckpt", 18) in records[5:]
    assert all(r["verified"] for r in trail if r["kind"] == "checkpoint_written")


def test_a_flipped_byte_in_the_newest_checkpoint_resumes_from_the_one_before(ddp):
    log = ddp["f"].stdout + ddp["f"].stderr
    assert ddp["f"].returncode == 0, log[-3000:]
    assert "epoch=2-step=18.ckpt does not match its SHA-256" in log
    assert "resume: from" in log and "epoch=1-step=15.ckpt (step 15, epoch 1)" in log
    for rank in (0, 1):
        resumed = losses(ddp["root"], "f", rank)
        assert min(resumed) == 15 and resumed == {s: v for s, v in losses(ddp["root"], "u", rank).items() if s >= 15}


def test_every_checkpoint_corrupt_ends_with_exit_1_naming_each(ddp):
    assert ddp["x"].returncode == 1, ddp["x"].stderr[-3000:]
    line = next(l for l in ddp["x"].stderr.splitlines() if "none is valid" in l)
    assert "found 2 checkpoint(s)" in line
    assert "epoch=0-step=3.ckpt: " in line and "epoch=0-step=6.ckpt: " in line
    assert "has 100 bytes" in line and "unreadable" in line
    assert not (ddp["root"] / "losses-x-rank0.jsonl").exists()  # never a silent fresh start


@pytest.fixture(scope="module")
def fsdp(sprite_cmd, tmp_path_factory):
    root = tmp_path_factory.mktemp("fsdp")
    runs = {"root": root, "ck": root / "ck"}
    runs["a"] = fit(sprite_cmd, root, "a", ["--strategy", "fsdp", "--run-dir", str(root / "run-a")], runs["ck"],
                    "--max-steps", "9", "--save-last", "--random-sampler")
    runs["a_dir"] = sorted(os.listdir(runs["ck"]))
    runs["b"] = fit(sprite_cmd, root, "b", ["--strategy", "fsdp", "--resume", str(runs["ck"] / "epoch=0-step=6.ckpt")],
                    root / "b_ck", "--max-steps", "9", "--full-state", "--every", "1", "--top-k", "1", "--random-sampler")
    shutil.copytree(runs["ck"], root / "c_ck")
    for name in ("last.ckpt", "epoch=0-step=9.ckpt"):  # both step-9 saves: a byte of rank 1's shard file flipped
        shard = root / "c_ck" / name / "__1_0.distcp"
        data = bytearray(shard.read_bytes())
        data[len(data) // 2] ^= 0x01
        os.unlink(shard)
        shard.write_bytes(bytes(data))
    # written by torch's checkpoint process instead of a thread of each rank
    runs["c"] = fit(sprite_cmd, root, "c", ["--strategy", "fsdp", "--resume", "auto", "--checkpoint-writer", "process",
                                            "--run-dir", str(root / "run-c")], root / "c_ck", "--max-steps", "9",
                    "--random-sampler")
    return runs


def test_fsdp_sharded_saves_are_sealed_folders_listing_every_ranks_shards(fsdp):
    assert fsdp["a"].returncode == 0, fsdp["a"].stderr[-3000:]
    assert fsdp["a_dir"] == ["epoch=0-step=3.ckpt", "epoch=0-step=6.ckpt", "epoch=0-step=9.ckpt", "last.ckpt"]
    for name in fsdp["a_dir"]:
        verdict = integrity.verify(fsdp["ck"] / name)
        assert verdict.valid, verdict.reason
        shards = {f"__{rank}_{i}.distcp" for rank in (0, 1) for i in range(1)}
        assert {".metadata", "meta.pt", *shards} == set(verdict.manifest["files"])
        meta = verdict.manifest["meta"]
        assert (meta["format"], meta["strategy"], meta["world_size"]) == ("dcp", "fsdp", 2)
    assert integrity.verify(fsdp["ck"] / "last.ckpt").manifest["meta"]["step"] == 9  # saved 3 times, swapped in


def test_fsdp_resumes_a_sharded_checkpoint_and_removes_replaced_manifests(fsdp):
    assert fsdp["b"].returncode == 0, fsdp["b"].stderr[-3000:]
    assert sorted(os.listdir(fsdp["root"] / "b_ck")) == ["epoch=0-step=9.ckpt", "epoch=0-step=9.ckpt.sprite-manifest.json"]
    verdict = integrity.verify(fsdp["root"] / "b_ck" / "epoch=0-step=9.ckpt")
    assert verdict.valid and verdict.manifest["meta"]["format"] == "file"
    for rank in (0, 1):
        resumed, first = losses(fsdp["root"], "b", rank), losses(fsdp["root"], "a", rank)
        assert resumed == {s: v for s, v in first.items() if s >= 6}


def test_fsdp_resume_auto_loads_the_one_before_a_sharded_checkpoint_found_changed_while_it_loaded(fsdp):
    log = fsdp["c"].stdout + fsdp["c"].stderr
    assert fsdp["c"].returncode == 0, log[-3000:]
    skipped = [line for line in log.splitlines() if "resume: skipped" in line]
    assert len(skipped) == 2 and all("__1_0.distcp does not match its SHA-256" in line for line in skipped)
    assert f"resume: from {fsdp['root'] / 'c_ck' / 'epoch=0-step=6.ckpt'} (step 6, epoch 0)" in log
    # and audited, in that order (sprite.runtime.ckpt.resume: a checkpoint found changed once it was loaded)
    trail = [r for r in audit.read(fsdp["root"] / "run-c" / "audit.jsonl")
             if r["kind"] in ("checkpoint_skipped", "resume")]
    assert sorted(Path(r["path"]).name for r in trail[:2]) == ["epoch=0-step=9.ckpt", "last.ckpt"], trail
    assert all(r["kind"] == "checkpoint_skipped" and "__1_0.distcp does not match" in r["reason"] for r in trail[:2])
    assert [(r["kind"], Path(r["path"]).name, r["step"]) for r in trail[2:]] == [("resume", "epoch=0-step=6.ckpt", 6)]
    for rank in (0, 1):
        resumed, first = losses(fsdp["root"], "c", rank), losses(fsdp["root"], "a", rank)
        assert resumed == {s: v for s, v in first.items() if s >= 6}  # the older checkpoint, bit for bit


def _same(a, b) -> bool:
    import torch

    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(map(_same, a, b))
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    return a == b


def test_a_process_mode_save_that_dev_shm_lacks_room_for_fails_the_run_in_one_line_and_keeps_the_one_before(
        sprite_cmd, tmp_path):
    """A state that grows after a save in torch's checkpoint process (a buffer made at step 4) is laid out again,
    larger, at the next save, while /dev/shm (a fake, from inside the script) has no room left: that save is
    refused in one line before a byte is copied, the run exits 1, and the save before stays valid."""
    ckpt = tmp_path / "ck"
    start = ckpt / "epoch=0-step=3.ckpt"
    result = fit(sprite_cmd, tmp_path, "g", ["--strategy", "fsdp", "--checkpoint-writer", "process"], ckpt,
                 "--max-steps", "9", "--grow-at-step", "4")
    log = result.stdout + result.stderr
    assert result.returncode == 1, log[-3000:]
    errors = [line for line in log.splitlines()
              if "sprite: error:" in line and "of shared memory for torch's checkpoint process" in line]
    assert errors and all(len(line) < 900 for line in errors), log[-3000:]
    assert "/dev/shm has 0 B free" in errors[0] and "still holds the save before's copy" in errors[0]
    assert "--checkpoint-writer thread" in errors[0] and "previous checkpoint is kept" in errors[0]
    verdict = integrity.verify(start)
    assert verdict.valid, verdict.reason
    grown = ckpt / "epoch=0-step=6.ckpt"
    assert not grown.exists() or not integrity.verify(grown).valid


def test_checkpoint_writer_process_writes_sharded_saves_that_seal_and_hold_the_same_state(fsdp, tmp_path):
    """``--checkpoint-writer process``: the resumed fit's sharded save at step 9 is written by torch's checkpoint
    process and sealed; it holds, bit for bit, what the first fit's save at step 9 (written by a thread of each
    rank) holds, as torch's own reader reads both; each save's record names its writer."""
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    assert fsdp["c"].returncode == 0, fsdp["c"].stderr[-3000:]

    def writers(tag: str) -> dict:
        records = audit.read(fsdp["root"] / f"run-{tag}" / "audit.jsonl")
        return {Path(r["path"]).name: r.get("writer") for r in records if r["kind"] == "checkpoint_written"
                and r["verified"]}

    assert set(writers("a").values()) == {"thread"} and len(writers("a")) == 4
    # the step-9 save (Lightning names it -v1: the changed folder of that name is still there)
    assert writers("c") == {"epoch=0-step=9-v1.ckpt": "process"}
    # each rank's checkpoint process joined the run's rendezvous store (dcp_write.prefix_store; torch's own line)
    joined = [line for line in (fsdp["c"].stdout + fsdp["c"].stderr).splitlines()
              if "checkpoint background process with prefix store" in line]
    assert sorted(line.split("]")[0] for line in joined) == ["[rank 0", "[rank 1"], joined
    # and logged none of its per-save lines (dcp_write.quiet_checkpoint_process): each rank's "Waiting" is the one
    # torch's process logs as it starts, before the first save's writer reaches it
    said = (fsdp["c"].stdout + fsdp["c"].stderr).splitlines()
    assert not [line for line in said if "Received async checkpoint" in line or "Completed checkpoint save" in line]
    assert sorted(line.split("]")[0] for line in said if "Waiting for checkpoint save request" in line) == \
        ["[rank 0", "[rank 1"]
    by_thread, by_process = fsdp["ck"] / "epoch=0-step=9.ckpt", fsdp["root"] / "c_ck" / "epoch=0-step=9-v1.ckpt"
    assert integrity.verify(by_process).valid
    for name, folder in (("thread", by_thread), ("process", by_process)):
        dcp_to_torch_save(folder, tmp_path / f"{name}.pt")
    thread_state, process_state = (torch.load(tmp_path / f"{name}.pt", weights_only=False)
                                   for name in ("thread", "process"))
    assert {"state_dict", "optimizer_0"} <= thread_state.keys()  # weights, Adam's state (Lightning's layout)
    assert _same(thread_state, process_state)
