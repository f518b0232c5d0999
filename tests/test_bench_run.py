"""`sprite bench` end to end on CPU: real ranks over gloo, launched through sprite's plan (sprite arm) and torchrun
without sprite (raw and lightning baselines); then `sprite bench compare` on the report it wrote.

A 1,2 sweep of `tiny` with DDP, both baselines and --measure-peak, shared by most assertions; an FSDP2 world of
2 against the raw loop; a launch that fails.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest
import torch

from sprite.parity.bench import model as bench_model
from sprite.parity.bench.flops import count
from sprite.parity.bench.settings import BenchSettings

pytestmark = pytest.mark.slow
STEP = ["--batch", "2", "--seq", "16", "--steps", "4", "--window", "2", "--warmup", "2"]


def bench(sprite_cmd, env, out, *args, give_out: bool = True):
    """`sprite bench --out OUT ARGS`, or without --out in OUT's folder when ``give_out`` is false (then OUT must be
    where the bench puts its results by default)."""
    result = subprocess.run([*sprite_cmd, "bench", *(("--out", str(out)) if give_out else ()), *args], env=env,
                            capture_output=True, text=True, timeout=1200,
                            cwd=out.parent if give_out else out.parent.parent)
    return result, (json.loads((out / "bench.json").read_text()) if (out / "bench.json").exists() else None)


@pytest.fixture(scope="module")
def ddp_sweep(tmp_path_factory, sprite_cmd):
    out = tmp_path_factory.mktemp("ddp") / "run"
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")}
    return (out, *bench(sprite_cmd, env, out, "--sweep", "1,2", *STEP, "--baseline", "raw", "--baseline",
                        "lightning", "--measure-peak"))


def test_sweep_writes_json_table_and_plot_once(ddp_sweep):
    out, result, report = ddp_sweep
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    lines = [line.rstrip() for line in result.stdout.splitlines()]
    assert lines.index("verdict: all of 6 launches measured") < lines.index("Step time and throughput")
    assert any(line.startswith("world 1 (cpu") and "x the raw PyTorch loop (" in line for line in lines)
    assert "plot: bench.png" in lines
    assert "timing: windows of 2 steps timed between two device synchronisations" in result.stdout
    assert "launch_bound: one window at twice the batch in sprite's arm at the smallest world" in result.stdout
    assert (out / "bench.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and report["plot"] == {"file": "bench.png"}
    files = [p for p in out.rglob("*") if p.is_file()]
    assert files and {stat.S_IMODE(p.stat().st_mode) for p in files} == {0o600}
    assert {stat.S_IMODE(p.stat().st_mode) for p in out.rglob("*") if p.is_dir()} == {0o700}
    assert [p["world"] for p in report["points"]] == [1, 2]
    assert all(set(p["arms"]) == {"sprite", "raw", "lightning"} for p in report["points"])


def test_arms_ran_what_they_claim(ddp_sweep):
    out, _, report = ddp_sweep
    records = {arm: json.loads((out / "runs" / "w2" / f"{arm}-r0" / "rank1.json").read_text())
               for arm in ("sprite", "raw", "lightning")}
    assert records["sprite"]["under_sprite"] and records["sprite"]["strategy_class"] == "XPUDDPStrategy"
    assert not records["lightning"]["under_sprite"] and records["lightning"]["strategy_class"] == "DDPStrategy"
    assert records["raw"]["lightning"] is None and records["raw"]["strategy_class"] == "DistributedDataParallel"
    assert [w["mode"] for w in records["sprite"]["windows"]] == ["sync", "nosync", "sync", "nosync"]
    # the launch-bound probe runs at the smallest world only, where the summary reports it
    world1 = json.loads((out / "runs" / "w1" / "sprite-r0" / "rank0.json").read_text())
    assert [w["mode"] for w in world1["windows"]] == ["sync", "sync", "probe"]
    # with baselines every arm starts as a fresh interpreter, although the suite's warm server is there
    assert not any(record["warm_served"] for record in records.values())


def test_a_sweep_without_baselines_on_cpu_runs_its_ranks_in_a_warm_server_of_its_own(tmp_path, sprite_cmd):
    """Also the bench without --out: its results go to a new ./sprite-checks/bench-<n>."""
    (tmp_path / "sprite-checks").mkdir()
    (tmp_path / "sprite-checks" / "bench-1").write_text("a user's file")
    out = tmp_path / "sprite-checks" / "bench-2"
    env = {k: v for k, v in os.environ.items()
           if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "SPRITE_WARM_SERVER")}
    private = Path(tempfile.gettempdir()).glob  # where the bench's own server puts its socket
    before = set(private("sprite-warm-*"))
    result, report = bench(sprite_cmd, env, out, "--sweep", "1,2", *STEP, give_out=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "results: sprite-checks/bench-2" in result.stdout and report is not None
    assert (tmp_path / "sprite-checks" / "bench-1").read_text() == "a user's file"
    assert "starting a warm server for the CPU launches" in result.stdout
    records = [json.loads(path.read_text()) for path in sorted(out.glob("runs/w*/sprite-r0/rank*.json"))]
    assert len(records) == 3 and all(record["warm_served"] for record in records)
    assert set(private("sprite-warm-*")) == before  # stopped and removed after


def test_numbers_are_consistent(ddp_sweep):
    _, _, report = ddp_sweep
    # FLOPs a rank counted in its step equal this process's count of the same model on the same batch shape.
    model = bench_model.build(BenchSettings(batch=2, seq=16))
    ids, labels = torch.randint(0, 256, (2, 16)), torch.tensor([0, 1])
    local = count(lambda: bench_model.loss(model, ids, labels).backward())
    one, two = (p["arms"]["sprite"] for p in report["points"])
    for world, figures in ((1, one), (2, two)):
        step = figures["step_s"]["median"]
        assert figures["tokens_per_step"] == 2 * 16 * world
        assert figures["tokens_per_s"] == pytest.approx(figures["tokens_per_step"] / step)
        assert figures["tokens_per_s_per_device"] == pytest.approx(figures["tokens_per_s"] / world)
        assert figures["flops_per_step"] == local * world
        assert figures["mfu"] == pytest.approx(local / step / 1e12 / figures["peak"]["tflops"])
        assert figures["peak"]["source"].startswith("measured: ") and figures["memory"] is None
        assert 0 <= figures["data_share"] < 1
    assert two["comm_s"] == pytest.approx(two["step_s"]["median"] - two["nosync_step_s"]["median"])
    assert one["comm_s"] is None and one["probe"]["batch"] == 4 and two["probe"] is None
    assert report["points"][1]["efficiency"] == pytest.approx(one["step_s"]["median"] / two["step_s"]["median"])
    raw = report["points"][0]["arms"]["raw"]["step_s"]["median"]
    assert report["points"][0]["ratios"]["raw"]["median"] == pytest.approx(one["step_s"]["median"] / raw)


def test_compare_exits_1_on_a_regression_and_0_within_tolerance(ddp_sweep, sprite_cmd, tmp_path):
    out, _, report = ddp_sweep
    slower = json.loads(json.dumps(report))
    for point in slower["points"]:
        point["arms"]["sprite"]["step_s"]["median"] *= 1.04
    (tmp_path / "new.json").write_text(json.dumps(slower))

    def compare(*args):
        return subprocess.run([*sprite_cmd, "bench", "compare", str(out), str(tmp_path / "new.json"), *args],
                              capture_output=True, text=True, timeout=120)

    within, beyond = compare(), compare("--tolerance", "0.03")  # docs/bench.md: the tolerance is 5% by default
    assert within.returncode == 0 and within.stdout.count(": ok") == 2, within.stdout + within.stderr
    assert beyond.returncode == 1 and "x1.040 (tolerance x1.030): REGRESSED" in beyond.stdout
    for point in slower["points"]:
        point["arms"]["sprite"]["step_s"]["median"] *= 1.06 / 1.04
    (tmp_path / "new.json").write_text(json.dumps(slower))
    past_default = compare()
    assert past_default.returncode == 1 and "(tolerance x1.050): REGRESSED" in past_default.stdout
    slower["settings"]["batch"] = 4
    (tmp_path / "other.json").write_text(json.dumps(slower))
    other = subprocess.run([*sprite_cmd, "bench", "compare", str(out), str(tmp_path / "other.json")],
                           capture_output=True, text=True, timeout=120)
    assert other.returncode == 2 and "measured different steps (batch 2 vs 4)" in other.stderr


def test_fsdp_world_of_two_against_the_raw_loop(tmp_path, sprite_cmd):
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")}
    result, report = bench(sprite_cmd, env, tmp_path / "run", "--strategy", "fsdp", "--sweep", "2", "--batch", "2",
                           "--seq", "16", "--steps", "2", "--window", "2", "--warmup", "1", "--precision",
                           "bf16-mixed", "--baseline", "raw")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    classes = {arm: json.loads((tmp_path / "run" / "runs" / "w2" / f"{arm}-r0" / "rank0.json").read_text())
               for arm in ("sprite", "raw")}
    assert classes["sprite"]["strategy_class"] == "FSDP2Strategy"
    assert classes["raw"]["strategy_class"] == "FSDPClassifier"  # fully_shard's class for the recipe's root
    arms = report["points"][0]["arms"]
    assert arms["sprite"]["comm_s"] is not None and arms["sprite"]["flops_per_step"] == arms["raw"]["flops_per_step"]


def test_a_failed_launch_is_reported_and_exits_1(tmp_path, sprite_cmd):
    broken = tmp_path / "checkpoint"
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "no-such-model"}')  # passes planning, fails in the rank
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")}
    result, report = bench(sprite_cmd, env, tmp_path / "run", "--model", str(broken), "--full", *STEP)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "verdict: 0 of 1 launches measured; 1 FAILED" in result.stdout
    assert report["failures"] == [{"what": "world 1 sprite repeat 1 exited 1", "log": "logs/w1-sprite-r0.log"}]
    assert report["plot"] == {"skipped": "no arm produced a result"}
    assert "no-such-model" in (tmp_path / "run" / "logs" / "w1-sprite-r0.log").read_text()
