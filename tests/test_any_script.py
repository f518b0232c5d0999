"""Any script, any launcher: a plain torch.distributed script and a Lightning Fabric script run the launched world
unchanged, and a launch whose script never joins the world is reported (docs/scripts.md).

Real launches on CPU (gloo), 2 ranks each: sprite's local supervisor, MPICH Hydra mpiexec and torchrun (srun: in
tests/test_multinode.py, which owns the several-slurmd Slurm). Each launch runs once per module; several tests read it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from sprite.contract import heartbeat
from sprite.contract.heartbeat import Beat
from sprite.recovery.watchdog import Limits, Watch
from conftest import WARM_SERVER, sprite_free_env

SCRIPTS = Path(__file__).resolve().parent / "scripts"
PLAIN, FABRIC = str(SCRIPTS / "any_plain.py"), str(SCRIPTS / "any_fabric.py")
VENV_BIN = str(Path(sys.executable).parent)
STRIP = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "NODE_RANK", "LOCAL_WORLD_SIZE",
         "GROUP_RANK", "PBS_JOBID", "PBS_NODEFILE", "SLURM_JOB_ID", "SLURM_JOB_NODELIST")
FLAGS = {"local": ["--launcher", "local"], "mpiexec": ["--launcher", "mpiexec"], "torchrun": ["--launcher", "torchrun"]}


def launch(sprite_cmd, cwd: Path, flags: list[str], script: str, args: list[str], env: dict | None = None
           ) -> subprocess.CompletedProcess:
    base = sprite_free_env(STRIP)
    if script == PLAIN:  # what a plain script's fresh ranks import is under test: no warm server's forks
        base.pop(WARM_SERVER, None)
    base["PATH"] = f"{VENV_BIN}{os.pathsep}{base.get('PATH', '')}"  # the MPICH wheel's mpiexec lives here
    cmd = [*sprite_cmd, "run", "--run-dir", str(cwd / "run"), *flags, script, *args]
    return subprocess.run(cmd, cwd=cwd, env={**base, **(env or {})}, capture_output=True, text=True, timeout=300)


def reports(folder: Path, prefix: str) -> list[dict]:
    return [json.loads((folder / f"{prefix}{rank}.json").read_text()) for rank in range(2)]


class Runs:
    """Each (script, launcher, extra flags) launch once, on first use."""

    def __init__(self, sprite_cmd, root: Path) -> None:
        self.sprite_cmd, self.root, self.done = sprite_cmd, root, {}

    def get(self, script: str, launcher: str, *extra: str) -> tuple[subprocess.CompletedProcess, Path]:
        key = (script, launcher, extra)
        if key not in self.done:
            folder = self.root / f"{Path(script).stem}-{launcher}-{len(self.done)}"
            folder.mkdir()
            args = [str(folder), *(["--alone"] if "alone" in extra else [])]
            flags = [*FLAGS[launcher], "--devices", "2", *[f for f in extra if f != "alone"]]
            self.done[key] = (launch(self.sprite_cmd, folder, flags, script, args), folder)
        return self.done[key]


@pytest.fixture(scope="module")
def runs(sprite_cmd, tmp_path_factory):
    return Runs(sprite_cmd, tmp_path_factory.mktemp("any"))


@pytest.mark.parametrize("launcher", ["local", "mpiexec", "torchrun"])
def test_plain_torch_distributed_script_reduces_across_the_launched_world(runs, launcher):
    proc, folder = runs.get(PLAIN, launcher)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    seen = reports(folder, "plain")
    assert [s["sum"] for s in seen] == [3.0, 3.0]  # ranks 0 and 1 contribute 1 + 2
    assert [(s["RANK"], s["LOCAL_RANK"], s["NODE_RANK"], s["GROUP_RANK"]) for s in seen] == [
        ("0", "0", "0", "0"), ("1", "1", "0", "0")]
    assert {(s["WORLD_SIZE"], s["LOCAL_WORLD_SIZE"], s["world"]) for s in seen} == {("2", "2", 2)}
    assert len({(s["MASTER_ADDR"], s["MASTER_PORT"]) for s in seen}) == 1
    assert "never joined" not in proc.stdout + proc.stderr
    # sprite's runtime imports Lightning only when the script does: a rank of a plain script started as a fresh
    # interpreter never pays for it; the local launcher's CPU ranks are forked from a supervisor that imported it
    assert {s["lightning_imported"] for s in seen} == {launcher == "local"}


@pytest.mark.parametrize("launcher, extra, strategy, precision", [
    ("mpiexec", (), "FabricDDPStrategy", "Precision"),
    ("local", ("--strategy", "fsdp", "--precision", "bf16-mixed"), "ModelParallelStrategy", "MixedPrecision"),
])
def test_fabric_script_trains_one_model_in_the_launched_world(runs, launcher, extra, strategy, precision):
    proc, folder = runs.get(FABRIC, launcher, *extra)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    seen = reports(folder, "fabric")
    assert [(s["rank"], s["local_rank"], s["node_rank"], s["world"], s["num_nodes"]) for s in seen] == [
        (0, 0, 0, 2, 1), (1, 1, 0, 2, 1)]
    assert {(s["strategy"], s["precision"]) for s in seen} == {(strategy, precision)}
    assert {s["autocast"] for s in seen} == ({"cpu"} if precision == "MixedPrecision" else {None})  # not "cuda"
    assert seen[0]["pid"] != seen[1]["pid"] and seen[0]["digest"] == seen[1]["digest"]  # one model, two processes
    assert seen[0]["environment"] in ("HydraEnvironment", "TorchrunEnvironment")
    # preemption and resume act on Trainer fits only: said once, at launch, never silently absent
    assert (proc.stdout + proc.stderr).count("a Fabric script gets no checkpoint-and-stop on SIGUSR1") == 1


def test_a_script_that_never_joins_the_world_is_reported_once(runs):
    proc, _ = runs.get(PLAIN, "local", "alone")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    lines = [line for line in out.splitlines() if "never joined a process group" in line]
    assert len(lines) == 1 and "[rank 0]" in lines[0] and "sprite: warning:" in lines[0], out[-3000:]


def test_strict_makes_a_script_that_never_joins_the_world_an_error(runs):
    proc, _ = runs.get(PLAIN, "mpiexec", "alone", "--strict")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 2, out[-3000:]
    assert "sprite: error: 2 ranks were launched, but this script never joined a process group" in out


# --- without launches -------------------------------------------------------------------------------------------

def _cfg(**over):
    from sprite.runtime.config import RuntimeConfig

    values = dict(accelerator="cpu", strategy="auto", precision="auto", num_nodes=2, devices=2, world_size=4,
                  launcher="hydra")
    return RuntimeConfig(**{**values, **over})


HYDRA = {"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2", "SPRITE_DEVICES": "2",
         "SPRITE_NUM_NODES": "2", "SPRITE_HOSTS": "127.0.0.1,127.0.0.2", "MASTER_PORT": "29500"}


def test_a_world_smaller_than_the_launch_is_reported_in_one_line_and_refused_under_strict(monkeypatch, capsys):
    """docs/scripts.md: a script whose process group had fewer ranks than were launched (Trainer(devices=1) in a
    2-rank launch) is named once, on rank 0; under --strict every such rank stops with exit 2."""
    from sprite.errors import UsageError
    from sprite.runtime import world_check

    monkeypatch.setattr(world_check, "_joined", 1)
    world_check.check(2, 0, "on")
    err = capsys.readouterr().err
    assert "process group had 1 rank(s)" in err and err.count("process group had") == 1
    world_check.check(2, 1, "on")
    assert "process group had" not in capsys.readouterr().err  # rank 0 says it
    with pytest.raises(UsageError, match="process group had 1 rank"):
        world_check.check(2, 1, "strict")
    world_check.check(1, 0, "on")
    assert capsys.readouterr().err == ""


def test_standard_variables_come_from_the_launchers_own_and_simulated_nodes_pass_the_host_check():
    from sprite.runtime import standard_env

    env = dict(HYDRA)
    standard_env.export(env, _cfg())
    assert {k: env[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK",
                                "MASTER_ADDR")} == {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4",
                                                    "LOCAL_WORLD_SIZE": "2", "NODE_RANK": "1", "GROUP_RANK": "1",
                                                    "MASTER_ADDR": "127.0.0.1"}


def test_a_contradicting_standard_variable_is_refused_naming_both_values():
    from sprite.errors import UsageError
    from sprite.runtime import standard_env

    with pytest.raises(UsageError, match=r"NODE_RANK=0 contradicts the launch, which makes this process NODE_RANK=1"):
        standard_env.export({**HYDRA, "NODE_RANK": "0"}, _cfg())


def test_the_host_check_still_refuses_a_host_outside_a_real_host_list():
    from sprite.errors import UsageError
    from sprite.runtime.ranks import node_from_hosts

    assert node_from_hosts(["n1", "n2"], "vm", names=("n2",)) == 1  # Slurm's own node name (SLURMD_NODENAME)
    assert node_from_hosts(["127.0.0.1", "127.0.0.2"], "vm", launcher_node=1) == 1
    with pytest.raises(UsageError, match=r"This host \(vm\) is not in SPRITE_HOSTS=x1,x2"):
        node_from_hosts(["x1", "x2"], "vm", launcher_node=0)
    with pytest.raises(UsageError, match="launcher put this rank on node 5"):
        node_from_hosts(["127.0.0.1", "127.0.0.2"], "vm", launcher_node=5)


def test_fabric_arguments_that_contradict_the_launch_stop_with_both_values():
    from sprite.errors import UsageError
    from sprite.runtime.fabric_wrap import launched_fabric_kwargs

    cfg = _cfg(num_nodes=1, world_size=2, launcher=None)  # no cluster environment: no rank variables needed
    kept = launched_fabric_kwargs(cfg, {"devices": 2, "strategy": "ddp", "precision": "32-true"})
    assert kept["devices"] == 2 and kept["num_nodes"] == 1 and type(kept["strategy"]).__name__ == "FabricDDPStrategy"
    with pytest.raises(UsageError, match=r"Fabric\(devices=3\) contradicts the launch, which has 2 rank\(s\) per node"):
        launched_fabric_kwargs(cfg, {"devices": 3})
    with pytest.raises(UsageError, match=r"Fabric\(num_nodes=2\) contradicts the launch, which has 1 node"):
        launched_fabric_kwargs(cfg, {"num_nodes": 2})
    with pytest.raises(UsageError, match=r"Fabric\(strategy='ddp'\) contradicts the launch.*strategy 'fsdp'"):
        launched_fabric_kwargs(_cfg(strategy="fsdp", num_nodes=1, world_size=2, launcher=None), {"strategy": "ddp"})
    with pytest.raises(UsageError, match="ddp_spawn"):
        launched_fabric_kwargs(cfg, {"strategy": "ddp_spawn"})


def _beat(rank: int, phase: str, step: int, count: int, first: int = -1) -> Beat:
    return Beat(rank, "h", 1, step, phase, count, 0.0, first)


def test_output_keeps_a_script_without_steps_alive_and_heartbeat_steps_take_over():
    watch = Watch(Limits.from_options(10, first_step=20), 2, started=0.0)
    start = {r: _beat(r, heartbeat.START, 0, 1) for r in range(2)}
    for now in range(0, 100, 5):  # a Fabric or plain script printing every 5 s: never a stall
        assert watch.observe(start, float(now), output=now * 10) is None
    assert watch.observe(start, 130.0, output=950) is not None  # silent past the first-step allowance
    stall = Watch(Limits.from_options(10, first_step=20), 2, started=0.0)
    stepping = {r: _beat(r, heartbeat.TRAINING, 5, 9, first=0) for r in range(2)}  # sprite.beat(step) reports
    assert stall.observe(stepping, 0.0, output=0) is None
    found = stall.observe(stepping, 15.0, output=500)  # output no longer counts once steps are reported
    assert found is not None and found.allowance == "stall timeout"


@pytest.mark.slow
def test_a_script_that_prints_is_not_stopped_and_a_silent_one_is(sprite_cmd, tmp_path):
    """docs/scripts.md end to end: a script that never calls sprite.beat is watched through its output. One rank
    that prints every 0.5 s for 14 s outlives a 2 s stall timeout and a 10 s first-step allowance (exit 0); the
    same script silent is stopped by the allowance (exit 124), its stop line naming sprite.beat. (The allowance
    also covers the rank's start-up, silent too: 4 s was too short with the two launches side by side.)"""
    script = tmp_path / "talk.py"
    script.write_text("import sys, time\nfor i in range(28):\n    time.sleep(0.5)\n"
                      "    if sys.argv[1] == 'talk':\n        print('working', i, flush=True)\n")
    flags = ["--launcher", "local", "--devices", "1", "--stall-timeout", "2", "--first-step-timeout", "10"]
    (tmp_path / "t").mkdir()
    (tmp_path / "s").mkdir()
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(2) as both:  # side by side: each mostly sleeps
        talking, silent = both.map(lambda args: launch(sprite_cmd, tmp_path / args[0], flags, str(script), [args[1]]),
                                   [("t", "talk"), ("s", "quiet")])
    assert talking.returncode == 0, talking.stderr[-3000:]
    assert silent.returncode == 124 and "sprite.beat(step)" in silent.stderr, silent.stderr[-3000:]


def test_sprite_beat_is_light_and_a_no_op_outside_a_launch():
    code = ("import sys, sprite; sprite.beat(3); sprite.beat(); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'lightning')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         cwd=VENV_BIN)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stderr


def test_sprite_beat_reports_steps_to_the_heartbeat(tmp_path):
    import sprite
    from sprite.runtime import beats

    (tmp_path / "heartbeat" / "attempt-1").mkdir(parents=True)
    heart = beats.start({"SPRITE_RUN_DIR": str(tmp_path), "SPRITE_ATTEMPT": "1", "SPRITE_HEARTBEAT_SECONDS": "1"}, 0)
    try:
        sprite.beat(0)
        sprite.beat(1)
        assert heart.beat.phase == heartbeat.TRAINING and heart.beat.past_first_step
    finally:
        beats._current = None


# --- docs/scripts.md stays true -----------------------------------------------------------------------------------

DOC = Path(__file__).resolve().parents[1] / "docs" / "scripts.md"
TABLE = {  # launched world | stall watchdog | preemption | resume | fit-start checks | run record
    "Lightning Trainer": ["yes"] * 6,
    "Lightning Fabric": ["yes", "sprite.beat(step) or output", "no: warned at launch", "no: warned at launch", "no",
                         "yes"],
    "plain torch.distributed": ["yes", "sprite.beat(step) or output", "no: warned at launch",
                                "no: warned at launch", "no", "yes"],
}


def test_docs_table_says_what_each_script_kind_gets():
    rows = {}
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 7 and cells[0] in TABLE:
            rows[cells[0]] = [re.sub(r"`", "", c) for c in cells[1:]]
    assert rows == TABLE


def test_trainer_only_features_are_named_once_for_a_fabric_or_plain_script(monkeypatch, capsys):
    from sprite.runtime import world_check

    monkeypatch.setattr(world_check, "_kind", "")
    monkeypatch.setattr(world_check, "_rank", 0)
    for name, value in (("SPRITE_PREEMPT_SIGNAL", "USR1"), ("SPRITE_RESUME", "auto"), ("SPRITE_CHECKS", "strict")):
        monkeypatch.setenv(name, value)
    world_check.seen("plain torch.distributed")
    world_check.seen("Fabric")  # the first kind seen counts, once
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("sprite: warning: a plain torch.distributed script gets no "
                                               "checkpoint-and-stop on SIGUSR1 and no --resume auto and no "
                                               "fit-start checks (--strict)")
    monkeypatch.setattr(world_check, "_kind", "")
    world_check.seen("Trainer")
    assert capsys.readouterr().err == ""


class FakeCudaForBinding:
    """Named fake: this machine has no GPU; records which device the runtime makes current."""

    def __init__(self, count: int) -> None:
        self.count, self.current = count, None

    def is_available(self) -> bool:
        return True

    def device_count(self) -> int:
        return self.count

    def set_device(self, index: int) -> None:
        self.current = index


def test_the_current_device_follows_the_local_rank(monkeypatch):
    import torch

    from sprite.runtime import standard_env

    fake = FakeCudaForBinding(2)
    monkeypatch.setattr(torch, "cuda", fake)
    standard_env.bind_device(_cfg(accelerator="cuda"), 1)
    assert fake.current == 1
    one = FakeCudaForBinding(1)  # one visible device per rank (a per-rank mask): nothing to choose
    monkeypatch.setattr(torch, "cuda", one)
    standard_env.bind_device(_cfg(accelerator="cuda"), 1)
    assert one.current is None


def test_an_xpu_rank_binds_its_local_tile_first_under_auto(monkeypatch):
    """docs/scripts.md: on xpu and cuda the current device is the rank's local rank; auto tries xpu first (a FAKE
    torch.xpu with 12 tiles beside a FAKE torch.cuda)."""
    import torch

    from sprite.runtime import standard_env
    from test_runtime_xpu import FakeXPUModule

    tiles, gpus = FakeXPUModule(count=12), FakeCudaForBinding(2)
    monkeypatch.setattr(torch, "xpu", tiles)
    monkeypatch.setattr(torch, "cuda", gpus)
    standard_env.bind_device(_cfg(accelerator="auto"), 7)
    assert tiles.selected == [7] and gpus.current is None
    standard_env.bind_device(_cfg(accelerator="xpu"), 11)
    assert tiles.selected == [7, 11]


FLAVOUR_ENVS = {  # rank 3 of 4, local rank 1 on node 1, in each launcher's own words (PALS, Open MPI: no machine here)
    "pals": {"PALS_RANKID": "3", "PALS_LOCAL_RANKID": "1", "PALS_NODEID": "1", "PMIX_RANK": "3", "WORLD_SIZE": "4"},
    "hydra": {"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"},
    "openmpi": {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
                "OMPI_COMM_WORLD_NODE_RANK": "1", "PMIX_RANK": "3"},
    "srun": {"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1", "SLURM_NODEID": "1"},
    "torchrun": {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "GROUP_RANK": "1", "LOCAL_WORLD_SIZE": "2"},
    "local": {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "NODE_RANK": "1"},
}


@pytest.mark.parametrize("flavour", sorted(FLAVOUR_ENVS))
def test_every_launcher_flavour_gets_the_standard_variables(flavour):
    from sprite.runtime import standard_env

    env = {**FLAVOUR_ENVS[flavour], "SPRITE_DEVICES": "2", "SPRITE_NUM_NODES": "2", "MASTER_ADDR": "10.0.0.1",
           "MASTER_PORT": "29500"}
    standard_env.export(env, _cfg(launcher=flavour))
    assert [env[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK",
                             "MASTER_ADDR", "MASTER_PORT")] == ["3", "1", "4", "2", "1", "1", "10.0.0.1", "29500"]
