"""`sprite bench` before anything runs: bad usage is one line and exit code 2, and every arm's launch plan (the
plan `sprite run` executes; torchrun without sprite's runtime for the baselines) in Slurm, PBS and local
worlds, and the progress lines of the launches. Planning only: nothing is started (a stand-in takes the
launches' place in the progress test)."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from sprite.cli import app as cli
from sprite.launch import execute
from sprite.parity.bench import runner as bench_runner
from sprite.parity.bench.runner import launches, plan_arm
from sprite.parity.bench.settings import BenchSettings


def run_cli(capsys, *args) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["bench", *args])
    return exit_info.value.code, capsys.readouterr().err


@pytest.mark.parametrize("args, fragment", [
    (("--sweep", "1,x"), "--sweep '1,x' is not a list of distinct world sizes."),
    (("--sweep", "2,2"), "is not a list of distinct world sizes"),
    (("--sweep", "3", "--devices", "2"), "--sweep 3 has 3 ranks, which --devices 2 ranks per node cannot fill."),
    (("--steps", "7", "--window", "2"), "--steps 7 is not a multiple of --window 2."),
    (("--compile", "--warmup", "1"), "--warmup 1 is too short."),
    (("--strategy", "deepspeed"), "--strategy 'deepspeed' is not supported. Use one of: ddp, fsdp."),
    (("--precision", "16-mixed"), "--precision '16-mixed' is not supported."),
    (("--baseline", "jax"), "--baseline 'jax' is not supported. Use one of: raw, lightning."),
    (("--accelerator", "xpu", "--baseline", "lightning"), "Lightning has no XPU accelerator without sprite."),
    (("--model", "org/some-hub-id"), "is neither a preset nor a checkpoint folder."),
    (("--batch", "0"), "must be at least 1"),
    (("--batch", "many"), "Invalid value for '--batch'"),
    (("--repeats", "100000000000"), "--repeats 100000000000 is more than 1,000."),  # it built the list and hung
    (("--batch", "99999999999"), "--batch 99999999999 is more than 1,048,576."),
    (("--sweep", "2000"), "--sweep 2000 puts 2000 ranks on one node, more than 1024."),  # it named --devices
])
def test_bad_usage_is_one_line_and_exit_2(capsys, tmp_path, args, fragment):
    code, err = run_cli(capsys, "--out", str(tmp_path / "run"), *args)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("sprite: error: "), err
    assert fragment in lines[0] and not (tmp_path / "run").exists()


def test_a_used_out_folder_is_refused(capsys, tmp_path, clean_env):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "bench.json").write_text("{}")
    code, err = run_cli(capsys, "--out", str(tmp_path / "run"))
    assert code == 2 and "is already used; refusing to run into it." in err
    assert (tmp_path / "run" / "bench.json").read_text() == "{}"


def test_compare_needs_two_reports(capsys, tmp_path):
    code, err = run_cli(capsys, "compare", str(tmp_path / "a.json"), str(tmp_path / "b.json"))
    assert code == 2 and err.count("\n") == 1 and "is not a readable bench.json" in err
    for bad in ("-0.1", "nan", "inf"):  # NaN and inf turned the gate off: nothing ever counted as regressed
        code, err = run_cli(capsys, "compare", "x", "y", "--tolerance", bad)
        assert code == 2 and f"--tolerance {float(bad)} is not a fraction between 0 and 10." in err, err


def test_plans_inside_a_slurm_allocation_take_whole_nodes(clean_env, tmp_path):
    env = {**clean_env, "SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "nid[001-002]", "SLURM_NTASKS_PER_NODE": "4"}
    settings = BenchSettings(sweep=(1, 4, 8), devices=4, baselines=("raw", "lightning"))
    assert [settings.placement(w) for w in settings.sweep] == [(1, 1), (1, 4), (2, 4)]
    sprite = plan_arm(tmp_path, settings, 8, "sprite", 0, env)
    assert sprite.argv[:8] == ["srun", "--label", "--nodes", "2", "--ntasks", "8", "--ntasks-per-node", "4"]
    assert sprite.argv[-11:-9] == ["-m", "sprite.runtime"] and sprite.argv[-9].endswith("step.py")
    assert sprite.env["SPRITE_WORLD_SIZE"] == "8" and sprite.argv[-8:] == [
        "--out", str(tmp_path), "--world", "8", "--arm", "sprite", "--repeat", "0"]
    raw = plan_arm(tmp_path, settings, 8, "raw", 0, env)
    # One torchrun agent per node, started by srun; each runs the plain script, no sprite runtime or contract.
    assert raw.argv[:2] == ["srun", "--nodes"] and "torch.distributed.run" in raw.argv
    assert "sprite.runtime" not in raw.argv and raw.argv[-9].endswith("raw.py")
    assert raw.argv[raw.argv.index("--nproc-per-node") + 1] == "4"
    assert not [key for key in raw.env if key.startswith("SPRITE_")]
    lightning = plan_arm(tmp_path, settings, 1, "lightning", 0, env)
    assert lightning.argv[-9].endswith("step.py") and "--nnodes" in lightning.argv


def test_plans_under_pbs_and_here(clean_env, tmp_path):
    nodefile = tmp_path / "nodes"
    nodefile.write_text("x1\nx2\n")
    pbs = {**clean_env, "PBS_JOBID": "1.pbs", "PBS_NODEFILE": str(nodefile)}
    settings = BenchSettings(sweep=(24,), devices=12)
    assert plan_arm(tmp_path, settings, 24, "sprite", 0, pbs).argv[:6] == ["mpiexec", "-prepend-rank", "-n", "24", "-ppn", "12"]
    here = plan_arm(tmp_path, BenchSettings(), 2, "sprite", 0, clean_env)
    assert here.argv[1:5] == ["-m", "sprite.launch.supervisor", "--nproc", "2"]
    raw = plan_arm(tmp_path, BenchSettings(), 2, "raw", 0, clean_env)
    assert here.env["OMP_NUM_THREADS"] == raw.env["OMP_NUM_THREADS"]  # the same threads in every arm


def test_repeats_interleave_arms_in_rotating_order():
    settings = BenchSettings(sweep=(1, 2), baselines=("raw", "lightning"), repeats=2)
    order = launches(settings)
    assert order[:3] == [(0, 1, "sprite"), (0, 1, "raw"), (0, 1, "lightning")]
    assert order[6:9] == [(1, 1, "raw"), (1, 1, "lightning"), (1, 1, "sprite")] and len(order) == 12


def test_missing_recipe_packages_are_named(capsys, tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "peft" else real(name, *a))
    code, err = run_cli(capsys, "--out", str(tmp_path / "run"))
    assert code == 2 and "sprite bench needs peft, not installed here." in err and "sprite-hpc[parity]" in err
    code, err = run_cli(capsys, "--out", str(tmp_path / "run"), "--full", "--sweep", "0")
    assert code == 2 and "--sweep '0'" in err  # --full needs no peft: validation goes on to the next flag


def test_launches_show_their_state_elapsed_time_and_what_is_left(tmp_path, monkeypatch):
    codes = iter([0, 0, 3, 0])  # the third launch (world 2, sprite) fails
    monkeypatch.setattr(bench_runner, "plan_arm", lambda *args: None)  # the stand-in below needs no plan
    monkeypatch.setattr(execute, "run_plan", lambda plan, log_path, timeout, cancel: next(codes))
    console = Console(file=io.StringIO(), force_terminal=False, width=200, color_system=None)
    results = bench_runner.run_all(tmp_path, BenchSettings(sweep=(1, 2), baselines=("raw",)), console)
    assert [r["exit_code"] for r in results] == [0, 0, 3, 0]
    lines = console.file.getvalue().splitlines()
    assert lines[0] == "[1/4] world 1 sprite #1: 1 process ..."  # in a log: one line per start and per end
    assert lines[1].startswith("[1/4] world 1 sprite #1: done in ") and lines[1].endswith(" left")
    assert lines[5].startswith("[3/4] world 2 sprite #1: failed, exit code 3, see ")
    assert "about" in lines[3] and lines[-1].endswith("about 0 s left")


def test_the_lightning_baseline_resolves_auto_as_sprite_does_and_refuses_xpu(monkeypatch, capsys):
    """docs/bench.md: --baseline lightning does not run on XPU, also where --accelerator auto finds XPU devices
    (Lightning's own auto knows no XPU and would train on the CPU). A FAKE torch.xpu with 4 devices stands in."""
    import torch

    from sprite.errors import UsageError
    from sprite.parity.bench import step
    from test_runtime_xpu import FakeXPUModule

    monkeypatch.setattr(step, "under_sprite_runtime", lambda: False)  # the lightning arm runs under torchrun
    assert step.trainer_kwargs(BenchSettings(accelerator="cpu"))["accelerator"] == "cpu"
    monkeypatch.setattr(torch, "xpu", FakeXPUModule(count=4))
    with pytest.raises(UsageError, match="cannot run on xpu"):
        step.trainer_kwargs(BenchSettings(accelerator="auto"))
    assert step.trainer_kwargs(BenchSettings(accelerator="cpu"))["accelerator"] == "cpu"
    # the arm's own entry point reports it as one line and exit 2 (the arm runs without sprite's runtime)
    monkeypatch.setattr(step, "main", lambda: step.trainer_kwargs(BenchSettings(accelerator="auto")))
    assert step.cli_main() == 2
    err = capsys.readouterr().err
    assert "cannot run on xpu" in err and err.count("\n") == 1 and "Traceback" not in err, err


def test_the_bench_starts_its_own_warm_server_importing_the_models_libraries(monkeypatch):
    """docs/bench.md: without baselines, on CPU and with no server set, the bench starts one of its own, which also
    imports transformers and peft (a FAKE private server records what it was asked for); with baselines none."""
    import contextlib

    from sprite.launch import warmserver, warmstart

    asked = []
    monkeypatch.setattr(warmstart, "wanted", lambda argv, env: True)
    monkeypatch.setattr(warmserver, "private", lambda modules, say, meanwhile: (asked.append(modules),
                                                                               contextlib.nullcontext())[1])
    console = Console(file=io.StringIO())
    bench_runner.warm_launches(BenchSettings(accelerator="cpu", baselines=()), console)
    assert asked == [("transformers", "peft")]
    bench_runner.warm_launches(BenchSettings(accelerator="cpu", baselines=("raw",)), console)
    assert asked == [("transformers", "peft")]
