"""sprite sbatch / qsub / status / cancel against a real single-node Slurm (tests/slurm_cluster.py).

The qsub test uses Slurm's PBS-compatible qsub (apt slurm-wlm-torque): its #PBS directives are read by sbatch.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from slurm_cluster import slurm  # noqa: F401  (fixture)

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def sprite(sprite_cmd, cluster, cwd, *args) -> subprocess.CompletedProcess:
    done = subprocess.run([*sprite_cmd, *args], env=cluster.env, cwd=cwd, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def submitted(done: subprocess.CompletedProcess) -> tuple[str, Path]:
    job_id = re.search(r"submitted \w+ job (\S+)", done.stdout).group(1)
    log = Path(re.search(r"^log\s+(\S+)$", done.stdout, re.M).group(1))
    return job_id, log


def test_sbatch_local_example_runs_two_ranks_to_completion(slurm, sprite_cmd, tmp_path):
    record = json.loads(sprite(sprite_cmd, slurm, tmp_path, "sbatch", "--json",
                               str(REPO / "conf" / "local.job.yaml")).stdout)
    job_id, log = record["job_id"], Path(record["log"])
    assert log == tmp_path / "sprite-jobs" / f"local-1-{job_id}.log"  # the new <job>-<n> name, reported as made
    assert record["script"] == str(tmp_path / "sprite-jobs" / "local-1.sbatch") and Path(record["script"]).is_file()
    assert record["launch"][:2] == ["srun", "--label"]  # what `sprite run` starts inside the job
    info = slurm.wait_state(job_id, ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"), timeout=180)
    text = log.read_text()
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", text[-3000:]
    assert re.search(r"0: rank 0/2: final loss \d", text) and re.search(r"1: rank 1/2: final loss \d", text), text[-3000:]
    status = sprite(sprite_cmd, slurm, tmp_path, "status", job_id).stdout
    assert "JobState=COMPLETED" in status and "ExitCode=0:0" in status
    parsed = json.loads(sprite(sprite_cmd, slurm, tmp_path, "status", "--json", job_id).stdout)
    assert parsed["source"] in ("squeue --json", "scontrol --json show job")  # Slurm 22.05: squeue's own JSON
    assert (parsed["job_id"], parsed["state"], parsed["exit_code"], parsed["name"]) == (job_id, "COMPLETED", 0, "local")


def _spec(tmp_path, script: str, scheduler: dict, **job) -> str:
    spec = {"site": "local", "script": script, "devices": 1, "accelerator": "cpu",
            "scheduler": {"walltime": "00:05:00", **scheduler}, **job}
    path = tmp_path / f"{Path(script).stem}.job.yaml"
    path.write_text(yaml.safe_dump(spec))
    return str(path)


def test_cancel_a_running_job(slurm, sprite_cmd, tmp_path):
    (tmp_path / "sleeper.py").write_text("import time\nprint('sleeping', flush=True)\ntime.sleep(600)\n")
    job_id, _ = submitted(sprite(sprite_cmd, slurm, tmp_path, "sbatch", _spec(tmp_path, "sleeper.py", {})))
    slurm.wait_state(job_id, ("RUNNING",), timeout=60)
    assert "RUNNING" in sprite(sprite_cmd, slurm, tmp_path, "status", job_id).stdout
    assert json.loads(sprite(sprite_cmd, slurm, tmp_path, "status", "--json", job_id).stdout)["state"] == "RUNNING"
    sprite(sprite_cmd, slurm, tmp_path, "cancel", job_id)
    assert slurm.wait_state(job_id, ("CANCELLED", "COMPLETED", "FAILED"), timeout=60)["JobState"] == "CANCELLED"


SIGNAL_SCRIPT = """\
import signal, sys, time
from pathlib import Path
def handler(signum, frame):
    Path(sys.argv[1]).write_text(signal.Signals(signum).name)
    sys.exit(0)
signal.signal(signal.SIGUSR1, handler)
print("waiting for SIGUSR1", flush=True)
time.sleep(110)
sys.exit(3)
"""


def test_preempt_signal_reaches_the_rank(slurm, sprite_cmd, tmp_path):
    (tmp_path / "trap.py").write_text(SIGNAL_SCRIPT)
    marker = tmp_path / "got-signal"
    # Slurm may send the signal up to 60 s before it is due: 120 - 45 - 60 leaves the rank 15 s to start.
    spec = _spec(tmp_path, "trap.py", {"walltime": "00:02:00", "preempt_signal": "USR1@45"}, args=[str(marker)])
    job_id, log = submitted(sprite(sprite_cmd, slurm, tmp_path, "sbatch", spec))
    info = slurm.wait_state(job_id, ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"), timeout=150)
    assert marker.exists() and marker.read_text() == "SIGUSR1", log.read_text()[-2000:]
    assert info["ExitCode"] == "0:0"


@pytest.mark.skipif(not shutil.which("qsub"), reason="Slurm's PBS qsub is not installed (apt slurm-wlm-torque)")
def test_qsub_through_slurms_pbs_wrapper(slurm, sprite_cmd, tmp_path):
    (tmp_path / "hello.py").write_text("import os\nprint('hello from rank', os.environ['SLURM_PROCID'], flush=True)\n")
    spec = _spec(tmp_path, "hello.py", {"select": "ncpus=2:mpiprocs=2", "job_name": "pbs-hello"}, devices=2)
    done = sprite(sprite_cmd, slurm, tmp_path, "qsub", spec)
    job_id, log = submitted(done)
    assert log == tmp_path / "sprite-jobs" / "pbs-hello-1.log"
    info = slurm.wait_state(job_id, ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"), timeout=120)
    text = log.read_text()
    assert info["JobState"] == "COMPLETED" and info["NumTasks"] == "2" and info["JobName"] == "pbs-hello", text
    assert "hello from rank 0" in text and "hello from rank 1" in text


HELLO = """import os, sys
print("hello from", os.environ["SLURM_PROCID"])
print("note from", os.environ["SLURM_PROCID"], file=sys.stderr)
"""


def test_a_rank_hung_under_srun_is_named_from_the_stacks_it_wrote_itself(slurm, sprite_cmd, tmp_path):
    """Issue 27 under srun, where the ranks are slurmstepd's children, not sprite's (tests/test_hang.py has the
    six hangs under the local launcher and Hydra)."""
    script = Path(__file__).parent / "scripts" / "hang_fit.py"
    done = subprocess.run(["salloc", "-n", "2", *sprite_cmd, "run", "--accelerator", "cpu", "--launcher", "srun",
                           "--stall-timeout", "6", "--run-dir", str(tmp_path / "run"), str(script), "--hang",
                           "train-sleep", "--work", str(tmp_path)], env=slurm.env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 124, done.stdout[-3000:] + done.stderr[-3000:]
    culprit = [line for line in done.stderr.splitlines() if "<- the likely culprit" in line]
    assert len(culprit) == 1 and culprit[0].startswith("sprite: stall: rank 1 on ") and \
        "stuck in training_step (hang_fit.py:" in culprit[0], done.stderr[-3000:]
    assert all((tmp_path / "run" / "stacks" / "attempt-1" / f"rank{r}.txt").stat().st_size > 500 for r in (0, 1))


def test_srun_writes_one_file_per_rank_and_the_console_follows_the_chosen_rank(slurm, sprite_cmd, tmp_path):
    (tmp_path / "hello.py").write_text(HELLO)
    done = subprocess.run(["salloc", "-n", "2", *sprite_cmd, "run", "--accelerator", "cpu", "--ranks", "1",
                           "--log-dir", "logs", "hello.py"], env=slurm.env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    for rank in (0, 1):
        lines = (tmp_path / "logs" / f"rank{rank}.log").read_text().splitlines()
        # The script never joins a process group: rank 0 says so once (docs/scripts.md), in its own log.
        warned = [line for line in lines if "sprite: warning:" in line]
        assert len(warned) == (1 if rank == 0 else 0) and all("never joined" in line for line in warned), lines
        lines = [line for line in lines if line not in warned]
        assert sorted(lines) == [f"{rank}: hello from {rank}", f"{rank}: note from {rank}"], lines
    assert "1: hello from 1" in done.stdout and "0: hello" not in done.stdout  # srun --label, rank 1 only
