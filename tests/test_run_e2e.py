"""sprite run end to end: real 2-rank Lightning fits on CPU (gloo) through the local supervisor and MPICH."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from sprite.launch import rendezvous

FRESH_RANKS = True  # the process tree of a launch is under test: no warm server's forks (conftest.py)

ENV_DUMP = """
import json, os, sys
from sprite import contract
json.dump(dict(os.environ), open(os.path.join(sys.argv[1], f"env{os.environ['RANK']}.json"), "w"))
"""


def fit(sprite_cmd, env, out: Path, *flags: str, steps: int = 4) -> subprocess.CompletedProcess:
    return subprocess.run([*sprite_cmd, "run", "--devices", "2", *flags, str(Path(__file__).parents[1] / "examples"
                           / "train.py"), "--max-steps", str(steps), "--out", str(out)],
                          env=env, cwd=out, capture_output=True, text=True, timeout=240)


def read_ranks(out: Path) -> list[dict]:
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(2)]


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["local", "torchrun"])
def test_two_rank_fit(sprite_cmd, clean_env, tmp_path, launcher):
    result = fit(sprite_cmd, clean_env, tmp_path, "--launcher", launcher)
    assert result.returncode == 0, result.stderr[-3000:]
    ranks = read_ranks(tmp_path)
    assert [r["world_size"] for r in ranks] == [2, 2]
    if launcher == "local":
        assert "[rank 1] rank 1/2: final loss" in result.stdout
    if shutil.which("srun", path=clean_env["PATH"]):  # Lightning's "prepend srun" hint is wrong for these launchers
        assert "The `srun` command is available" not in result.stdout + result.stderr


@pytest.mark.slow
def test_mpiexec_hydra_two_rank_fit(sprite_cmd, clean_env, tmp_path):
    mpiexec = shutil.which("mpiexec", path=clean_env["PATH"])
    assert mpiexec, "MPICH's mpiexec is part of the test extra (pip install mpich)"
    version = subprocess.run([mpiexec, "--version"], capture_output=True, text=True)
    assert "HYDRA" in version.stdout + version.stderr
    result = fit(sprite_cmd, clean_env, tmp_path, "--launcher", "mpiexec", "--mpi", "hydra")
    assert result.returncode == 0, result.stderr[-3000:]
    ranks = read_ranks(tmp_path)
    assert sorted(r["rank"] for r in ranks) == [0, 1] and all(r["world_size"] == 2 for r in ranks)


def test_ranks_see_every_variable_of_the_plan(sprite_cmd, clean_env, tmp_path):
    script = tmp_path / "dump.py"
    script.write_text(ENV_DUMP)
    port = rendezvous.free_port()  # given, so the dry run and the run plan the same port
    base = [*sprite_cmd, "run", "--devices", "2", "--env", "EXTRA_FLAG=1", "--run-dir", str(tmp_path / "run"),
            "--master-port", str(port), str(script), str(tmp_path)]
    plan = json.loads(subprocess.run([*base[:2], "--dry-run", "--json", *base[2:]], env=clean_env,
                                     capture_output=True, text=True, check=True).stdout)
    assert not (tmp_path / "run").exists()  # a dry run creates no run folder
    assert plan["env"]["MASTER_PORT"] == str(port)
    subprocess.run(base, env=clean_env, check=True, timeout=60, capture_output=True)
    for rank in range(2):
        seen = json.loads((tmp_path / f"env{rank}.json").read_text())
        assert {k: seen.get(k) for k in plan["env"]} == plan["env"]
        assert seen["RANK"] == seen["LOCAL_RANK"] == str(rank)
        assert seen["SPRITE_RUN_DIR"] == str(tmp_path / "run") and seen["SPRITE_ATTEMPT"] == "1"


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(x) for x in path.read_text().split()] if path.exists() else []


@pytest.mark.slow
def test_killing_one_rank_ends_sprite_run_quickly(sprite_cmd, clean_env, tmp_path):
    proc = subprocess.Popen([*sprite_cmd, "run", "--devices", "2", str(Path(__file__).parents[1] / "examples" /
                             "train.py"), "--max-steps", "1000000"], env=clean_env, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)
    reader.start()
    deadline = time.monotonic() + 120
    while not any("[rank 1]" in line for line in lines) and time.monotonic() < deadline:
        time.sleep(0.2)
    supervisor = _children(proc.pid)  # sprite run is the parent of the supervisor, whose children are the ranks
    assert len(supervisor) == 1, lines[-20:]
    ranks = _children(supervisor[0])
    assert len(ranks) == 2, lines[-20:]
    descendants = supervisor + ranks + [c for r in ranks for c in _children(r)]
    killed_at = time.monotonic()
    os.kill(ranks[1], signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == 128 + signal.SIGKILL  # the killed rank's fate is sprite run's exit code
    assert time.monotonic() - killed_at < 30
    time.sleep(0.5)
    left = [pid for pid in descendants if Path(f"/proc/{pid}").exists()
            and Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"]
    assert left == []


CRASH = """
import sys
import torch, torch.distributed as dist
dist.init_process_group("gloo")
out = [None] * dist.get_world_size()
dist.all_gather_object(out, dist.get_rank())
for _ in range(5):
    dist.all_reduce(torch.ones(1000))
dist.barrier()
if len(sys.argv) > 1:
    sys.exit(int(sys.argv[1]))
raise RuntimeError("the script failed on purpose")
"""


@pytest.mark.slow
@pytest.mark.parametrize("how", ["exception", "exit 3"])
def test_a_failing_gloo_rank_exits_with_its_own_code_not_an_abort(sprite_cmd, clean_env, tmp_path, how):
    # With its gloo group alive, a rank leaving the interpreter could abort ("terminate called without an active
    # exception", -6) instead of exiting 1 or its sys.exit code: the runtime destroys the group first.
    (tmp_path / "crash.py").write_text(CRASH)
    args = ["3"] if how == "exit 3" else []
    result = subprocess.run([*sprite_cmd, "run", "--devices", "2", "--accelerator", "cpu", "crash.py", *args],
                            env=clean_env, cwd=tmp_path, capture_output=True, text=True, timeout=240)
    text = result.stdout + result.stderr
    code = 3 if args else 1
    assert result.returncode == code and f"exited with code {code}" in text, text[-3000:]
    assert "terminate called" not in text and "code -6" not in text
