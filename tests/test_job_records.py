"""Machine-readable job commands, planning only: each scheduler's own JSON parsed into one record, a
submission's --dry-run showing the launch inside the job, and submissions the site would refuse.

No PBS Pro exists here: its parser reads tests/data/pbs_pro_qstat_f_F_json.handwritten.json, a HAND-WRITTEN
sample in PBS Pro's format (tests/data/README.md says where the format comes from). Slurm's JSON is exercised
for real against the Slurm fixture in test_submit_slurm.py; the 23.02+ record shape below is written by hand.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from sprite.jobs import submit
from sprite.errors import SpecError
from sprite.schedulers import pbs, slurm

DATA = Path(__file__).parent / "data"
REPO = Path(__file__).resolve().parents[1]


def test_pbs_qstat_json_record():
    text = (DATA / "pbs_pro_qstat_f_F_json.handwritten.json").read_text()
    running = pbs.parse_qstat_json(text, "8505298")
    assert running["job_id"] == "8505298.aurora-pbs-0001.hostmgmt.cm.aurora.alcf.anl.gov"
    assert (running["state"], running["exit_code"], running["account"]) == ("RUNNING", None, "MyProject")
    assert running["log"] == "/lus/flare/projects/MyProject/sprite-jobs/aurora.log"
    done = pbs.parse_qstat_json(text, "8505301.aurora-pbs-0001.hostmgmt.cm.aurora.alcf.anl.gov")
    assert (done["state"], done["exit_code"], done["name"]) == ("FINISHED", 3, "sweep")
    assert pbs.parse_qstat_json(text, "1") is None
    with pytest.raises(ValueError):
        pbs.parse_qstat_json("qstat: Unknown Job Id 1", "1")


def test_pbs_status_record_asks_qstat_for_history_json(tmp_path):
    text = (DATA / "pbs_pro_qstat_f_F_json.handwritten.json").read_text()
    calls = []

    def run(argv, what):
        calls.append(argv)
        return subprocess.CompletedProcess(argv, 0, stdout=text, stderr="")

    record = pbs.PBS().status_record("8505301", run, lambda name: f"/opt/pbs/bin/{name}")
    assert calls == [["/opt/pbs/bin/qstat", "-x", "-f", "-F", "json", "8505301"]]
    assert record["state"] == "FINISHED" and record["source"] == "qstat -x -f -F json"


SLURM_23 = {"jobs": [{"job_id": 77, "name": "train", "job_state": ["FAILED"], "state_reason": "NonZeroExitCode",
                      "exit_code": {"status": ["EXITED"], "return_code": {"set": True, "infinite": False, "number": 3}},
                      "nodes": "nid[001-002]", "standard_output": "/out/train-77.log"}]}


def test_slurm_json_records_of_22_05_and_23_02():
    newer = slurm.parse_job_json(json.dumps(SLURM_23), "77", "squeue --json")
    assert (newer["state"], newer["exit_code"], newer["nodes"]) == ("FAILED", 3, "nid[001-002]")
    # Slurm 22.05: one state string, exit_code a raw wait status (768 = exit 3), every job listed whatever -j says.
    older = {"jobs": [{"job_id": 5, "job_state": "RUNNING", "exit_code": 0}, {"job_id": 6, "job_state": "FAILED",
                                                                            "exit_code": 768, "name": "x"}]}
    assert slurm.parse_job_json(json.dumps(older), "6", "squeue --json")["exit_code"] == 3
    assert slurm.parse_job_json(json.dumps(older), "9", "squeue --json") is None
    text = "JobId=6 JobName=x JobState=FAILED Reason=NonZeroExitCode ExitCode=3:0 NodeList=vm StdOut=/o/x.log"
    assert slurm.parse_scontrol_text(text, "6")["exit_code"] == 3


def write_spec(tmp_path, site: str, scheduler: dict, **job) -> str:
    spec = {"site": site, "script": str(REPO / "examples" / "train.py"), "nodes": 1, "scheduler": scheduler, **job}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(spec))
    return str(path)


def test_dry_run_shows_the_launch_inside_the_job(tmp_path):
    prepared = submit.prepare(write_spec(tmp_path, "aurora", {"account": "P", "walltime": "00:10:00"},
                                         cpu_bind="depth", log_dir="logs"), "pbs", cwd=str(tmp_path))
    assert prepared.launch[:5] == ("mpiexec", "--label", "--line-buffer", "-n", "12")
    assert prepared.launch[prepared.launch.index("--cpu-bind") + 1] == "depth"  # the spec's cpu_bind key
    text = prepared.dry_run_text()
    assert text.startswith(prepared.text) and "\n# mpiexec --label --line-buffer -n 12 " in text
    assert f"--cpu-bind depth --log-dir {tmp_path / 'logs'} " in prepared.text  # the job's sprite run gets both
    check = subprocess.run(["bash", "-n"], input=text, capture_output=True, text=True)
    assert check.returncode == 0, check.stderr  # the comments keep it a valid script


def test_site_that_requires_an_account_refuses_or_warns(tmp_path):
    with pytest.raises(SpecError, match=r"scheduler\.account.*aurora charges every job to one"):
        submit.prepare(write_spec(tmp_path, "aurora", {"walltime": "00:10:00"}), "pbs", cwd=str(tmp_path))
    with pytest.raises(SpecError, match=r"scheduler\.account.*polaris charges every job to one"):  # docs/jobs.md
        submit.prepare(write_spec(tmp_path, "polaris", {"walltime": "00:10:00"}), "pbs", cwd=str(tmp_path))
    warned = submit.prepare(write_spec(tmp_path, "perlmutter", {"walltime": "00:10:00"}), "slurm",
                            cwd=str(tmp_path))
    assert len(warned.warnings) == 1 and "charged to your default project" in warned.warnings[0]
    assert submit.prepare(write_spec(tmp_path, "perlmutter", {"walltime": "00:10:00", "account": "m1_g"}),
                          "slurm", cwd=str(tmp_path)).warnings == ()
    assert submit.prepare(write_spec(tmp_path, "local", {"walltime": "00:10:00"}), "slurm",
                          cwd=str(tmp_path)).warnings == ()


def test_submit_json_and_warning_through_the_cli(sprite_cmd, tmp_path):
    spec = write_spec(tmp_path, "perlmutter", {"walltime": "00:10:00"})
    done = subprocess.run([*sprite_cmd, "sbatch", "--dry-run", "--json", spec], capture_output=True, text=True,
                          cwd=tmp_path, timeout=60)
    assert done.returncode == 0, done.stderr
    record = json.loads(done.stdout)
    assert record["dry_run"] and record["script"].endswith("/sprite-jobs/job-1.sbatch") and record["log"]
    assert record["launch"][:2] == ["srun", "--label"] and record["script_text"].startswith("#!/bin/bash")
    assert done.stderr.startswith("sprite: warning: ") and "scheduler.account" in done.stderr
