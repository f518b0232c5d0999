"""sprite's four headline commands (README), run as users type them, each where it can run here; each ends 0.

- `sprite run --nodes 2 --strategy fsdp train.py`: planned (`--dry-run`) inside a two-node PBS allocation (a
  PBS_NODEFILE of two loopback hosts); the launch of that plan on simulated nodes is tested elsewhere.
- `sprite qsub job.yaml`: submitted through Slurm's PBS-style qsub to the suite's real Slurm (then cancelled: the
  qsub job of tests/test_submit_slurm.py runs to completion), and `--dry-run`.
- `sprite parity --precision bf16-mixed`: the ``bf16_2`` run of tests/test_parity_runs.py is this command, exactly,
  through the installed `sprite` in a folder of its own (its results go to ./sprite-checks/parity-1); it is not
  launched twice.
- `sprite ckpt-check`: the ``fp32`` check of tests/test_ckpt_check.py is this command, exactly, the same way.
The last two are checked here to be the headline commands, parsed by the real command tree.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

import test_ckpt_check
import test_parity_runs
from slurm_cluster import slurm  # noqa: F401  (fixture)
from test_doc_commands import parse

REPO = Path(__file__).resolve().parents[1]


def sprite(sprite_cmd, env: dict, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    done = subprocess.run([*sprite_cmd, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def test_run_nodes_2_strategy_fsdp_in_a_two_node_pbs_allocation(sprite_cmd, clean_env, tmp_path):
    shutil.copy(REPO / "examples" / "train.py", tmp_path / "train.py")
    (tmp_path / "nodefile").write_text("127.0.0.1\n127.0.0.2\n")
    env = {**clean_env, "PBS_JOBID": "7.headline", "PBS_NODEFILE": str(tmp_path / "nodefile")}
    command = ["run", "--nodes", "2", "--strategy", "fsdp", "--dry-run"]
    plan = json.loads(sprite(sprite_cmd, env, tmp_path, *command, "--json", "train.py").stdout)
    assert plan["argv"][0] == "mpiexec" and plan["argv"][-3:] == ["-m", "sprite.runtime", str(tmp_path / "train.py")]
    assert plan["argv"][plan["argv"].index("-hosts") + 1] == "127.0.0.1,127.0.0.2"
    assert {key: plan["env"][key] for key in ("SPRITE_NUM_NODES", "SPRITE_STRATEGY", "SPRITE_HOSTS", "MASTER_ADDR")} \
        == {"SPRITE_NUM_NODES": "2", "SPRITE_STRATEGY": "fsdp", "SPRITE_HOSTS": "127.0.0.1,127.0.0.2",
            "MASTER_ADDR": "127.0.0.1"}
    text = sprite(sprite_cmd, env, tmp_path, *command, "train.py").stdout
    assert re.search(r"^world\s+2 node\(s\) x 1 rank\(s\) = 2 ranks$", text, re.M) and "scheduler  pbs" in text
    assert not (tmp_path / "sprite-runs").exists()  # a plan only: no run folder


def test_run_nodes_2_strategy_fsdp_outside_any_job_says_why_and_how(sprite_cmd, clean_env, tmp_path):
    """Typed on a login node or a laptop: exit 2 in one line that names the missing job and how to get one, and
    nothing is made."""
    shutil.copy(REPO / "examples" / "train.py", tmp_path / "train.py")
    done = subprocess.run([*sprite_cmd, "run", "--nodes", "2", "--strategy", "fsdp", "train.py"], env=clean_env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("sprite: error: --nodes 2 asks for 2 nodes, but no "
                                                                   "PBS or Slurm job runs here")
    assert "submit it with `sprite qsub JOB.yaml` (nodes: 2), or use --nodes 1." in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.py"]


@pytest.mark.skipif(not shutil.which("qsub"), reason="Slurm's PBS qsub is not installed (apt slurm-wlm-torque)")
def test_qsub_job_yaml_through_slurms_pbs_qsub(slurm, sprite_cmd, tmp_path):  # noqa: F811
    (tmp_path / "hello.py").write_text("import os\nprint('hello from rank', os.environ['SLURM_PROCID'], flush=True)\n")
    spec = {"site": "local", "script": "hello.py", "devices": 2, "accelerator": "cpu",
            "scheduler": {"walltime": "00:05:00", "select": "ncpus=2:mpiprocs=2", "job_name": "headline"}}
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(spec))
    script = sprite(sprite_cmd, slurm.env, tmp_path, "qsub", "--dry-run", "job.yaml").stdout
    assert script.startswith("#!") and "#PBS -N headline" in script and not (tmp_path / "sprite-jobs").exists()
    done = sprite(sprite_cmd, slurm.env, tmp_path, "qsub", "job.yaml")
    job_id = re.search(r"submitted \w+ job (\S+)", done.stdout).group(1)
    try:  # Slurm took the job; tests/test_submit_slurm.py runs such a qsub job to completion (about 40 s here)
        info = slurm.job(job_id)
        assert info["JobName"] == "headline" and info["NumTasks"] == "2", info
    finally:
        subprocess.run(["scancel", job_id], env=slurm.env, capture_output=True, timeout=30)


@pytest.mark.parametrize("headline, module", [
    (("parity", "--precision", "bf16-mixed"), test_parity_runs),
    (("ckpt-check",), test_ckpt_check),
])
def test_parity_and_ckpt_check_run_as_headlines_in_their_modules(headline, module):
    """Those modules launch exactly these words, nothing added; the words run the harness itself, not a command
    or its help."""
    assert module.HEADLINE == headline
    assert parse(list(headline)) == [f"sprite {headline[0]}"]
