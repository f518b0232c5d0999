"""Bad input to sprite qsub / sbatch / status / cancel: one line on stderr, exit 2, no traceback."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]


def spec_file(tmp_path, scheduler: dict, site: str = "aurora", **job) -> str:
    spec = {"site": site, "script": str(REPO / "examples" / "train.py"), "scheduler": scheduler, **job}
    path = tmp_path / "bad.job.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return str(path)


def one_line_error(done: subprocess.CompletedProcess) -> str:
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    return lines[0]


@pytest.mark.parametrize("cmd,scheduler,job,expect", [
    ("qsub", {"walltime": "1:30"}, {}, ["bad.job.yaml:", "scheduler.walltime", "HH:MM:SS"]),
    ("qsub", {"walltime": "00:30:00", "queue": "debug", "nodes": 3}, {},
     ["scheduler.nodes", "'debug' queue", "1-2"]),
    ("qsub", {"walltime": "00:30:00", "queue": "debug"}, {"nodes": 5}, ["key 'nodes'", "'debug' queue"]),
    ("qsub", {"queue": "debug", "walltime": "02:00:00"}, {}, ["scheduler.walltime", "01:00:00"]),
    ("qsub", {"queue": "nosuch"}, {}, ["scheduler.queue", "debug, debug-scaling, prod"]),
    ("qsub", {"partition": "gpu"}, {}, ["scheduler.partition", "SLURM key"]),
    ("qsub", {"walltme": "00:10:00"}, {}, ["scheduler.walltme", "not a scheduler key"]),
    ("qsub", {"dependency": "afterany:12"}, {}, ["scheduler.dependency", "afterok"]),
    ("qsub", {"preempt_signal": "KILL@60"}, {}, ["scheduler.preempt_signal", "USR1@90"]),
    ("sbatch", {}, {}, ["schedules jobs with PBS", "sprite qsub"]),
])
def test_bad_spec_is_one_line_exit_2(cmd, scheduler, job, expect, sprite_cmd, tmp_path):
    done = subprocess.run([*sprite_cmd, cmd, "--dry-run", spec_file(tmp_path, scheduler, **job)],
                          capture_output=True, text=True)
    line = one_line_error(done)
    for part in expect:
        assert part in line, line


def test_missing_scheduler_command_is_one_line_exit_2(sprite_cmd, tmp_path):
    env = {**os.environ, "PATH": str(tmp_path)}  # an empty folder: no qsub, sbatch, qstat or squeue
    spec = spec_file(tmp_path, {}, site="local", devices=2, accelerator="cpu")
    for argv, expect in (([*sprite_cmd, "sbatch", spec], "'sbatch' is not on PATH"),
                         ([*sprite_cmd, "qsub", spec], "'qsub' is not on PATH"),
                         ([*sprite_cmd, "status", "12"], "Neither squeue"),
                         ([*sprite_cmd, "cancel", "12", "--scheduler", "pbs"], "'qdel' is not on PATH")):
        line = one_line_error(subprocess.run(argv, env=env, cwd=tmp_path, capture_output=True, text=True))
        assert expect in line, line


def test_bad_job_id_and_scheduler_flag(sprite_cmd):
    assert "is not a job id" in one_line_error(subprocess.run([*sprite_cmd, "cancel", "--", "-1;rm"],
                                                              capture_output=True, text=True))
    assert "'lsf' is not one of 'pbs', 'slurm'" in one_line_error(subprocess.run(
        [*sprite_cmd, "status", "1", "--scheduler", "lsf"], capture_output=True, text=True))


def test_bad_site_submit_block_names_the_profile_line(tmp_path, sprite_cmd):
    site = tmp_path / "mysite.yaml"
    site.write_text("name: mysite\nscheduler: pbs\nsubmit:\n  walltime: \"00:10:00\"\n  filesystems: [home, 'a b']\n")
    done = subprocess.run([*sprite_cmd, "qsub", "--dry-run", spec_file(tmp_path, {}, site=str(site))],
                          capture_output=True, text=True)
    line = one_line_error(done)
    assert "mysite.yaml:5" in line and "submit.filesystems" in line, line
