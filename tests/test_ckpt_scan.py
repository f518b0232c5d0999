"""Choosing the checkpoint to resume, `sprite ckpt verify/list`, `--resume` planning. No training processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest

from sprite import contract, integrity
from sprite.integrity import scan as ckpt_scan
from sprite.cli import app as cli
from sprite.launch import plan
from sprite.runtime.ckpt import seal as ckpt_seal

from conftest import OUTSIDE_CHECKOUT


def _ckpt(folder, step: int, sealed: bool = True, payload: bytes = b""):
    path = folder / f"epoch=0-step={step}.ckpt"
    integrity.write_new(path, payload or f"weights at {step}".encode() * 50)
    if sealed:
        integrity.seal(path, {"step": step, "epoch": 0, "time": f"2026-01-01T00:00:{step:02d}"})
    return path


def _flip(path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def test_the_newest_valid_checkpoint_is_chosen_and_newer_broken_ones_are_named(tmp_path):
    _ckpt(tmp_path, 3, payload=b"no manifest, older than the choice")  # an old checkpoint sprite never sealed
    os.unlink(integrity.manifest_path(tmp_path / "epoch=0-step=3.ckpt"))
    os.utime(tmp_path / "epoch=0-step=3.ckpt", (time.time() - 3600,) * 2)
    _ckpt(tmp_path, 6)
    _flip(_ckpt(tmp_path, 9))
    _ckpt(tmp_path, 12, sealed=False)  # a save cut short
    chosen, skipped, found = ckpt_scan.choose([tmp_path, tmp_path / "missing"])
    assert found == 4 and chosen.path.name == "epoch=0-step=6.ckpt" and chosen.valid and chosen.step == 6
    reasons = {entry.path.name: entry.reason for entry in skipped}
    assert set(reasons) == {"epoch=0-step=9.ckpt", "epoch=0-step=12.ckpt"}
    assert "does not match its SHA-256" in reasons["epoch=0-step=9.ckpt"]
    assert "has no manifest" in reasons["epoch=0-step=12.ckpt"]


def test_no_valid_checkpoint_lists_every_one_and_an_empty_folder_finds_none(tmp_path):
    _flip(_ckpt(tmp_path, 3))
    _ckpt(tmp_path, 6, sealed=False)
    (tmp_path / "notes.txt").write_text("not a checkpoint")
    chosen, skipped, found = ckpt_scan.choose([tmp_path])
    assert chosen is None and found == 2 and len(skipped) == 2
    assert ckpt_scan.choose([tmp_path / "empty"]) == (None, [], 0)


def test_a_folder_save_never_writes_into_an_existing_folder(tmp_path):
    target = tmp_path / "last.ckpt"
    assert ckpt_seal._plan(target, folder=True) == {"write": str(target), "swap": False, "replaces": False}
    assert target.is_dir()
    again = ckpt_seal._plan(target, folder=True)
    fresh = again["write"]
    assert again["swap"] and again["replaces"] and fresh != str(target) and os.path.basename(fresh).startswith(".last.ckpt.sprite-new-")
    assert os.path.isdir(fresh) and os.listdir(fresh) == []


def test_each_rank_hashes_its_own_shards(tmp_path):
    for name in ("__0_0.distcp", "__1_0.distcp", "__1_1.distcp", ".metadata", "meta.pt"):
        (tmp_path / name).write_bytes(b"x")
    assert ckpt_seal._mine(tmp_path, 0, 2) == [".metadata", "__0_0.distcp", "meta.pt"]
    assert ckpt_seal._mine(tmp_path, 1, 2) == ["__1_0.distcp", "__1_1.distcp"]


def _cli(argv, capsys) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(argv)
    out = capsys.readouterr()
    return exit_info.value.code, out.out, out.err


def test_ckpt_verify_and_list_exit_codes(tmp_path, capsys):
    good, bad = _ckpt(tmp_path, 3), _ckpt(tmp_path, 6)
    _flip(bad)
    code, out, _ = _cli(["ckpt", "verify", str(good)], capsys)
    assert code == 0 and "valid:" in out and "step 3" in out
    code, _, err = _cli(["ckpt", "verify", str(bad)], capsys)
    assert code == 1 and "epoch=0-step=6.ckpt does not match its SHA-256" in err and len(err.splitlines()) == 1
    assert "It was cut short or changed after the save. Use another" in err and ".." not in err
    foreign = tmp_path / "foreign.pt"
    foreign.write_bytes(b"not sprite's")
    code, _, err = _cli(["ckpt", "verify", str(foreign)], capsys)
    assert code == 1 and "has no manifest (foreign.pt.sprite-manifest.json). It was not saved under sprite" in err
    assert ".." not in err and len(err.splitlines()) == 1
    foreign.unlink()
    assert _cli(["ckpt", "verify", str(tmp_path / "nope")], capsys)[0] == 2
    assert _cli(["ckpt", "list", str(good)], capsys)[0] == 2
    code, out, _ = _cli(["ckpt", "list", str(tmp_path), "--json"], capsys)
    rows = json.loads(out)
    assert code == 0 and [(r["step"], r["valid"]) for r in rows] == [(6, False), (3, True)]
    assert [(r["epoch"], r["size"]) for r in rows] == [(0, bad.stat().st_size), (0, good.stat().st_size)]
    code, out, _ = _cli(["ckpt", "list", str(tmp_path)], capsys)
    assert code == 0 and "valid" in out and "does not match its SHA-256" in out
    from sprite.errors import size_text

    header = next(line for line in out.splitlines() if "checkpoint" in line and "status" in line)
    assert [word for word in header.split() if word.isalpha()] == ["checkpoint", "step", "epoch", "size", "status"]
    assert size_text(good.stat().st_size) in out, out  # "600 B"


def test_ckpt_commands_import_no_torch(tmp_path):
    path = _ckpt(tmp_path, 3)
    probe = f"""
import sys
from sprite.cli import app as cli
for argv in (["ckpt", "verify", {str(path)!r}], ["ckpt", "list", {str(tmp_path)!r}]):
    try:
        cli.main(argv)
    except SystemExit as exit:
        assert exit.code == 0, (argv, exit.code)
heavy = sorted({{m.split('.')[0] for m in sys.modules}} & {{'torch', 'lightning', 'numpy'}})
sys.stderr.write("HEAVY=" + repr(heavy))
"""
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60,
                            cwd=OUTSIDE_CHECKOUT)
    assert result.returncode == 0 and result.stderr.endswith("HEAVY=[]"), result.stderr[-500:]


def test_resume_is_planned_into_the_contract(clean_env, example_script, tmp_path):
    assert plan.plan_run({"script": example_script}, clean_env).env[contract.RESUME] == "never"
    assert plan.plan_run({"script": example_script, "resume": "auto"}, clean_env).env[contract.RESUME] == "auto"
    ckpt = _ckpt(tmp_path, 3)
    spec = tmp_path / "job.yaml"
    spec.write_text(f"script: {example_script}\nresume: {ckpt.name}\n")
    assert plan.plan_run({}, clean_env, spec_file=str(spec)).env[contract.RESUME] == str(ckpt)
    from sprite.errors import UsageError

    with pytest.raises(UsageError, match="no such checkpoint"):
        plan.plan_run({"script": example_script, "resume": str(tmp_path / "gone.ckpt")}, clean_env)


def test_single_file_saves_are_hashed_while_written(tmp_path):
    import hashlib

    from sprite.runtime.ckpt import save as hashed_save

    target = tmp_path / "epoch=0-step=1.ckpt"
    hashed_save.atomic_save({"w": list(range(1000))}, target)
    assert os.listdir(tmp_path) == [target.name]  # written whole under a temporary name, then renamed
    assert hashed_save.known_entry(target)["sha256"] == hashlib.sha256(target.read_bytes()).hexdigest()
    hashed_save.atomic_save({"w": [1]}, target)  # a later save to the name replaces it, as Lightning's does
    assert hashed_save.known_entry(target)["sha256"] == hashlib.sha256(target.read_bytes()).hexdigest()
    target.write_bytes(target.read_bytes() + b"changed")
    assert hashed_save.known_entry(target) is None  # a changed file is hashed again when sealed


def test_a_large_single_file_save_is_hashed_piece_by_piece_after_torch_writes_it(tmp_path, monkeypatch):
    import torch

    from sprite import integrity
    from sprite.integrity import digest
    from sprite.runtime.ckpt import durable
    from sprite.runtime.ckpt import save as hashed_save

    monkeypatch.setattr(digest, "CHUNK", 1 << 16)
    state = {"w": torch.arange(100_000, dtype=torch.float32), "step": 3}
    target = tmp_path / "big.ckpt"
    hashed_save.atomic_save(state, target)
    entry = hashed_save.known_entry(target)
    assert len(entry["sha256_chunks"]) == -(-target.stat().st_size // (1 << 16)) > 1
    assert entry == integrity.describe(target)[target.name]  # what hashing the file afterwards gives
    loaded = torch.load(target, weights_only=True)
    assert loaded["step"] == 3 and torch.equal(loaded["w"], state["w"])
    assert os.listdir(tmp_path) == [target.name]
    events, fsync, replace = [], os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}"),
                                                                threading.current_thread().name)), fsync(fd))[1])
    monkeypatch.setattr(os, "replace", lambda a, b: (events.append(("replace", os.fspath(a), "")), replace(a, b))[1])
    hashed_save.atomic_save(state, target)  # replaces a checkpoint: durable before it takes the name
    renamed = next(i for i, (what, _, _) in enumerate(events) if what == "replace")
    assert [e for e in events[:renamed] if e[:2] == ("fsync", events[renamed][1])], events
    events.clear()
    hashed_save.atomic_save(state, tmp_path / "durable.ckpt")  # a new name: fsynced in the background
    assert durable.drain(60)
    assert [e[0] for e in events if e[0] == "replace" or e[1].endswith("durable.ckpt")] == ["replace", "fsync"]
    assert events[-1][2] == "sprite-durable", events
    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    (tmp_path / "durable.ckpt").unlink()
    with pytest.raises(Exception, match="pickle"):
        hashed_save.atomic_save({"w": lambda: None}, tmp_path / "bad.ckpt")  # cannot be pickled
    assert os.listdir(tmp_path) == [target.name]  # the failed save left no temporary file
