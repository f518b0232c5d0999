"""Checkpoints saved in the background, in real 2-rank gloo DDP fits under `sprite run`
(tests/scripts/ckpt_background.py: tests/scripts/ckpt_fit.py with slow, failing or preempted background writes):
- the whole launch SIGKILLed at random moments while background saves run: every checkpoint left is valid or
  refused with its reason (`sprite ckpt list`), and `--resume auto` continues from the newest valid one;
- a preemption while a background save is in flight exits 75 with the preemption checkpoint valid;
- a background write that fails (a full disk, simulated) fails the run with one clear line and keeps the previous
  checkpoint valid.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sprite import integrity
from sprite.errors import EXIT_PREEMPTED
from conftest import sprite_free_env

pytestmark = pytest.mark.slow

SCRIPT = str(Path(__file__).resolve().parent / "scripts" / "ckpt_background.py")
VENV_BIN = str(Path(sys.executable).parent)
STRIP = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "NODE_RANK", "PBS_JOBID", "SLURM_JOB_ID")


def _env(**extra) -> dict:
    env = sprite_free_env(STRIP)
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    env.update({key: str(value) for key, value in extra.items()})
    return env


def _cmd(sprite_cmd, root: Path, tag: str, ckpt: Path, flags=(), *args) -> list:
    return [*sprite_cmd, "run", "--devices", "2", *flags, SCRIPT, "--out", str(root), "--tag", tag,
            "--ckpt-dir", str(ckpt), *args]


def _run(sprite_cmd, root: Path, tag: str, ckpt: Path, flags=(), *args, **env) -> subprocess.CompletedProcess:
    result = subprocess.run(_cmd(sprite_cmd, root, tag, ckpt, flags, *args), cwd=root, env=_env(**env),
                            capture_output=True, text=True, timeout=400)
    (root / f"{tag}.log").write_text(result.stdout + result.stderr)
    return result


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    parent = int(stat.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and every process below it, all frozen first (SIGSTOP), so none outlives the others."""
    tree = [pid, *_descendants(pid)]
    for each in tree:
        try:
            os.kill(each, signal.SIGSTOP)
        except ProcessLookupError:
            pass
    for each in [*tree, *_descendants(pid)]:
        try:
            os.kill(each, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _listing(sprite_cmd, ckpt: Path) -> list[dict]:
    out = subprocess.run([*sprite_cmd, "ckpt", "list", str(ckpt), "--json"], capture_output=True, text=True,
                         env=_env(), timeout=120)
    return json.loads(out.stdout)


def test_a_launch_killed_at_random_moments_leaves_valid_or_refused_checkpoints_and_resumes(sprite_cmd, tmp_path):
    rng = random.Random(26)
    for trial in range(3):
        root = tmp_path / f"t{trial}"
        root.mkdir()
        ckpt = root / "ck"
        proc = subprocess.Popen(_cmd(sprite_cmd, root, "k", ckpt, (), "--every", "1", "--max-steps", "60",
                                     "--top-k", "3"),
                                cwd=root, env=_env(CKPT_SLOW=0.05), stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 300
        while not (ckpt.exists() and any(name.endswith(integrity.MANIFEST_SUFFIX) for name in os.listdir(ckpt))):
            assert proc.poll() is None and time.monotonic() < deadline, "no checkpoint was sealed"
            time.sleep(0.05)
        time.sleep(rng.uniform(0.0, 1.5))  # somewhere in the middle of the next background saves
        _kill_tree(proc.pid)  # the whole launch: sprite run and both ranks (in sessions of their own)
        proc.wait(60)
        rows = _listing(sprite_cmd, ckpt)
        assert rows, "nothing listed"
        for row in rows:  # valid, or refused with its reason
            assert row["valid"] == integrity.verify(Path(row["path"])).valid and (row["valid"] or row["reason"]), row
        valid = [row for row in rows if row["valid"]]
        assert valid
        newest = max(valid, key=lambda row: row["step"])
        resumed = _run(sprite_cmd, root, "r", ckpt, ("--resume", "auto"), "--every", "5", "--max-steps",
                       str(newest["step"] + 2))
        assert resumed.returncode == 0, resumed.stderr[-3000:]
        assert f"resume: from {newest['path']} (step {newest['step']}" in resumed.stdout + resumed.stderr


def test_a_preemption_while_a_background_save_is_in_flight_exits_75_with_its_checkpoint_valid(sprite_cmd, tmp_path):
    ckpt = tmp_path / "ck"
    result = _run(sprite_cmd, tmp_path, "p", ckpt, (), "--every", "2", "--max-steps", "40",
                  CKPT_SLOW=1.0, CKPT_SIGNAL_AT=2)
    log = result.stdout + result.stderr
    assert result.returncode == EXIT_PREEMPTED, log[-3000:]
    preempted = [name for name in os.listdir(ckpt) if name.startswith("preempted-")
                 and not name.endswith(integrity.MANIFEST_SUFFIX)]
    assert len(preempted) == 1, os.listdir(ckpt)
    assert integrity.verify(ckpt / preempted[0]).valid
    for name in os.listdir(ckpt):
        if not name.endswith(integrity.MANIFEST_SUFFIX) and not name.startswith("."):
            assert integrity.verify(ckpt / name).valid, name  # the save in flight was sealed before the exit


def test_a_background_write_that_fails_fails_the_run_in_one_line_and_keeps_the_previous_checkpoint(sprite_cmd,
                                                                                                   tmp_path):
    ckpt = tmp_path / "ck"
    result = _run(sprite_cmd, tmp_path, "f", ckpt, (), "--every", "3", "--max-steps", "20", "--top-k", "1",
                  CKPT_FAIL_AT=2)
    log = result.stdout + result.stderr
    assert result.returncode == 1, log[-3000:]
    errors = [line for line in log.splitlines() if "sprite: error:" in line and "No space left" in line]
    assert errors and all(len(line) < 700 for line in errors), log[-3000:]
    assert any("previous checkpoint is kept" in line for line in errors), errors
    first = ckpt / "epoch=0-step=3.ckpt"
    assert integrity.verify(first).valid  # kept: the save that was to supersede it failed
    assert not any(name.startswith(".") and "sprite-tmp" in name for name in os.listdir(ckpt))
    assert not (ckpt / "epoch=0-step=6.ckpt").exists()


def test_a_sharded_save_one_other_rank_could_not_write_is_sealed_by_none_and_resume_skips_it(sprite_cmd, tmp_path):
    """docs/checkpoints.md: rank 0 seals only once every rank confirmed its files. Rank 1 alone fails to write its
    shard file of the step-6 save (ENOSPC) while rank 0 writes its own: no manifest, the run exits 1 with rank 1's
    reason on one line, the step-3 save is kept valid, ``sprite ckpt list`` shows the step-6 folder refused, and
    ``--resume auto`` skips it and goes on from step 3."""
    ckpt = tmp_path / "ck"
    result = _run(sprite_cmd, tmp_path, "s", ckpt, ("--strategy", "fsdp"), "--every", "3", "--max-steps", "20",
                  "--top-k", "1", CKPT_FAIL_SHARDS_AT="1:2")
    log = result.stdout + result.stderr
    assert result.returncode == 1, log[-3000:]
    errors = [line for line in log.splitlines() if "sprite: error:" in line]
    assert any(line.startswith("[rank 1]") and "No space left" in line and "epoch=0-step=6.ckpt" in line
               for line in errors), errors
    assert all(len(line) < 700 for line in errors), errors
    kept, failed = ckpt / "epoch=0-step=3.ckpt", ckpt / "epoch=0-step=6.ckpt"
    assert integrity.verify(kept).valid
    assert not os.path.lexists(integrity.manifest_path(failed))
    rows = {Path(row["path"]).name: row for row in _listing(sprite_cmd, ckpt)}
    assert rows[kept.name]["valid"], rows
    # the folder rank 0 made for the save (seal._plan) and wrote its share into, left without a manifest
    assert not rows[failed.name]["valid"] and "has no manifest" in rows[failed.name]["reason"], rows
    resumed = _run(sprite_cmd, tmp_path, "t", ckpt, ("--strategy", "fsdp", "--resume", "auto"), "--every", "5",
                   "--max-steps", "5")
    said = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0, said[-3000:]
    assert f"resume: from {kept} (step 3" in said, said[-3000:]


def test_a_background_write_after_the_fit_that_fails_still_fails_the_run(sprite_cmd, tmp_path):
    """A save the script makes once ``fit`` returned (rank 0's third write here) fails in the background: no later
    save and no end of a fit waits for it, so the end of the script must (exit 1, after the ranks ended together)."""
    ckpt = tmp_path / "ck"
    after = tmp_path / "after.ckpt"
    result = _run(sprite_cmd, tmp_path, "l", ckpt, (), "--every", "3", "--max-steps", "6", "--save-after-fit",
                  str(after), CKPT_FAIL_AT=3)
    log = result.stdout + result.stderr
    assert result.returncode == 1, log[-3000:]
    assert any("sprite: error:" in line and "A checkpoint saved in the background failed" in line
               for line in log.splitlines()), log[-3000:]
    assert integrity.verify(ckpt / "epoch=0-step=6.ckpt").valid
    assert not after.exists()
