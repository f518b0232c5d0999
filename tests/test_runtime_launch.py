"""Real 2-rank launches on CPU (gloo) through `sprite run`: local supervisor and MPICH Hydra mpiexec.

Each launch costs ~10-20 s of imports per rank, so each runs once per module and several tests read its JSON.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import sprite_free_env

SCRIPTS = Path(__file__).resolve().parent / "scripts"
PROBE = str(SCRIPTS / "runtime_probe.py")
VENV_BIN = str(Path(sys.executable).parent)
CLIP = 0.05
PAIRS = {"local": [], "mpiexec": ["--clip", str(CLIP)]}  # the mpiexec pair also clips by global norm
STRIP = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "NODE_RANK", "PBS_JOBID", "SLURM_JOB_ID")


def sprite_run(sprite_cmd, cwd: Path, flags: list[str], script: str, args: list[str]) -> subprocess.CompletedProcess:
    env = sprite_free_env(STRIP)
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"  # the MPICH wheel's mpiexec lives here
    cmd = [*sprite_cmd, "run", *flags, script, *args]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


class Launches:
    """Runs each (launcher, strategy) pair once, on first use, and keeps the per-rank reports."""

    def __init__(self, sprite_cmd, root: Path):
        self.sprite_cmd, self.root, self.done = sprite_cmd, root, {}

    def probe(self, launcher: str, strategy: str) -> list[dict]:
        key = (launcher, strategy)
        if key not in self.done:
            out = self.root / f"{launcher}-{strategy}"
            flags = ["--devices", "2", "--launcher", launcher, "--strategy", strategy, "--accelerator", "cpu"]
            proc = sprite_run(self.sprite_cmd, self.root, flags, PROBE, ["--out", str(out), *PAIRS[launcher]])
            assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
            self.done[key] = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
        return self.done[key]


@pytest.fixture(scope="module")
def launches(sprite_cmd, tmp_path_factory):
    return Launches(sprite_cmd, tmp_path_factory.mktemp("launches"))


@pytest.mark.parametrize("launcher", ["local", "mpiexec"])
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_plain_script_trains_the_launched_world(launches, launcher, strategy):
    reports = launches.probe(launcher, strategy)
    assert [r["rank"] for r in reports] == [0, 1]
    assert {r["world_size"] for r in reports} == {2}
    assert {r["strategy"] for r in reports} == {"XPUDDPStrategy" if strategy == "ddp" else "FSDP2Strategy"}
    env = {"local": "TorchrunEnvironment", "mpiexec": "HydraEnvironment"}[launcher]
    assert {r["environment"] for r in reports} == {env}
    assert reports[0]["losses"] != reports[1]["losses"], "both ranks saw the same rows: data was not sharded"
    assert all(len(r["losses"]) == 4 for r in reports)


@pytest.mark.parametrize("launcher", ["local", "mpiexec"])
def test_ddp_parameters_are_bitwise_equal_on_both_ranks(launches, launcher):
    r0, r1 = launches.probe(launcher, "ddp")
    assert r0["params"].keys() == r1["params"].keys()
    for name in r0["params"]:
        assert r0["params"][name]["value"] == r1["params"][name]["value"], name


@pytest.mark.parametrize("launcher", ["local", "mpiexec"])
def test_fsdp2_trainables_are_sharded_dtensors(launches, launcher):
    reports = launches.probe(launcher, "fsdp")
    for name, p0 in reports[0]["params"].items():
        p1 = reports[1]["params"][name]
        assert p0["dtensor"] and p1["dtensor"], name
        assert p0["placements"] == p1["placements"] == ["S(0)"], name
        assert p0["local_numel"] + p1["local_numel"] == p0["numel"], name
        assert p0["value"] == p1["value"], f"{name}: gathered values differ between ranks"
    big = reports[0]["params"]["net.2.weight"]
    assert big["local_numel"] < big["numel"]


@pytest.mark.parametrize("launcher", ["local", "mpiexec"])
def test_ddp_and_fsdp2_agree_in_fp32(launches, launcher):
    ddp, fsdp = launches.probe(launcher, "ddp"), launches.probe(launcher, "fsdp")
    for rd, rf in zip(ddp, fsdp):
        assert rd["losses"][0] != rd["losses"][-1], "nothing trained"
        assert rf["losses"] == pytest.approx(rd["losses"], abs=1e-5, rel=0)
        for name, p in rd["params"].items():
            assert rf["params"][name]["value"] == pytest.approx(p["value"], abs=1e-5, rel=0), name


def test_global_norm_clipping_under_ddp_and_fsdp2(launches):
    unclipped = launches.probe("local", "ddp")[0]["norms"]
    assert min(unclipped) > 2 * CLIP, "the clip would not be active: pick a smaller CLIP"
    for strategy in ("ddp", "fsdp"):
        for report in launches.probe("mpiexec", strategy):
            # per-shard clipping would leave a gathered norm near CLIP * sqrt(2)
            assert report["norms"] == pytest.approx([CLIP] * 4, rel=1e-4), strategy


def test_bf16_mixed_autocasts_with_an_accelerator_instance(sprite_cmd, tmp_path):
    out = tmp_path / "bf16"
    flags = ["--devices", "1", "--launcher", "local", "--accelerator", "cpu"]
    args = ["--out", str(out), "--accelerator-instance", "--precision", "bf16-mixed", "--max-steps", "2"]
    proc = sprite_run(sprite_cmd, tmp_path, flags, PROBE, args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((out / "rank0.json").read_text())
    assert report["precision_plugin"] == "XPUMixedPrecision"
    assert report["linear_dtypes"] == ["torch.bfloat16"]


@pytest.mark.parametrize("launcher,strategy,environment", [("local", "auto", "NoneType"),
                                                         ("mpiexec", "ddp", "LightningEnvironment")])
def test_one_rank_never_starts_mpi(sprite_cmd, tmp_path, launcher, strategy, environment):
    """Left to itself, Lightning's environment detection imports mpi4py.MPI, which starts MPI in the rank; on one
    H200 Open MPI's start-up then took the preemption signal away from it (docs/runs/h200-2026-12-03-c). One rank
    of any launcher gets Lightning's fallback environment instead (a single-device strategy keeps none)."""
    import importlib.util

    assert importlib.util.find_spec("mpi4py"), "the test extras install mpi4py: without it this test checks nothing"
    out = tmp_path / "one"
    flags = ["--devices", "1", "--launcher", launcher, "--strategy", strategy, "--accelerator", "cpu"]
    proc = sprite_run(sprite_cmd, tmp_path, flags, PROBE, ["--out", str(out), "--max-steps", "1"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((out / "rank0.json").read_text())
    assert (report["world_size"], report["environment"], report["mpi_started"]) == (1, environment, False)


def test_lightning_alone_still_autocasts_cuda_for_an_accelerator_instance(tmp_path):
    """The evidence for XPUMixedPrecision (accelerator_connector.py:489): when this fails, the workaround can go."""
    out = tmp_path / "plain"
    args = ["--out", str(out), "--accelerator-instance", "--precision", "bf16-mixed", "--max-steps", "1"]
    env = sprite_free_env(STRIP)
    proc = subprocess.run([sys.executable, PROBE, *args], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((out / "rank0.json").read_text())["linear_dtypes"] == ["torch.float32"]


def test_fsdp2_refuses_trainables_outside_fully_shard(sprite_cmd, tmp_path):
    flags = ["--devices", "2", "--launcher", "local", "--strategy", "fsdp", "--accelerator", "cpu"]
    proc = sprite_run(sprite_cmd, tmp_path, flags, str(SCRIPTS / "runtime_unsharded.py"), [])
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "FIT FINISHED" not in text
    line = next(x for x in text.splitlines() if "not managed by fully_shard" in x)
    assert "extra.weight" in line and "extra.bias" in line and "replicated" in line
    assert "net." not in line


def test_trainer_devices_contradicting_the_launch_fail_before_the_process_group(sprite_cmd, tmp_path):
    flags = ["--devices", "2", "--launcher", "local", "--accelerator", "cpu"]
    proc = sprite_run(sprite_cmd, tmp_path, flags, PROBE, ["--out", str(tmp_path / "x"), "--devices", "4"])
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "Trainer(devices=4)" in text and "2 rank(s) per node" in text
    assert "Initializing distributed" not in text and "Traceback" not in text
