"""Issue 32, second pass: inputs that reached a launcher's pattern, a traceback, a silent drop or a misleading line.

Each test drives the real ``sprite`` command (a subprocess) or the function that failed, and checks the outcome
the user sees: one line, the right exit code, the secret masked, nothing of theirs touched or left behind.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from slurm_cluster import slurm  # noqa: F401  (fixture)
from sprite.errors import SpriteError
from sprite.schedulers.pbs import PBS

HELLO = "print('hello from sprite')\n"
MPIEXEC = Path(sys.executable).parent / "mpiexec"


@pytest.fixture
def work(tmp_path, clean_env, monkeypatch):
    """A folder holding a tiny script and a plain file ``afile``, as the current folder."""
    (tmp_path / "t.py").write_text(HELLO)
    (tmp_path / "afile").write_text("mine\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def sprite(sprite_cmd, cwd, *args, env=None, timeout=120) -> subprocess.CompletedProcess:
    return subprocess.run([*sprite_cmd, *args], cwd=cwd, env=env or dict(os.environ), capture_output=True,
                          text=True, timeout=timeout)


def refused(done: subprocess.CompletedProcess, code: int = 2) -> str:
    """The one error line of a refused command (no traceback), checked to carry exit code ``code``."""
    lines = done.stderr.strip().splitlines()
    assert done.returncode == code, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr and len(lines) == 1 and lines[0].startswith("sprite: error: "), done.stderr
    return lines[0]


def snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else None) for p in folder.rglob("*")}


def spec(folder: Path, body: dict, name: str = "job.yaml") -> Path:
    path = folder / name
    path.write_text(yaml.safe_dump(body))
    return path


# --- launcher patterns in paths ---------------------------------------------------------------------------------

@pytest.mark.skipif(not MPIEXEC.exists(), reason="the MPICH wheel's mpiexec is not in the venv")
def test_hydra_log_dir_with_a_pattern_is_refused_before_any_user_file_is_touched(work, sprite_cmd):
    (work / "M0").mkdir()
    (work / "M0" / "rank0.log").write_text("keep me\n")
    before = snapshot(work)
    done = sprite(sprite_cmd, work, "run", "--launcher", "mpiexec", "--mpi", "hydra", "--devices", "2",
                  "--run-dir", "R", "--log-dir", "M%r", "t.py")
    line = refused(done)
    assert "%" in line and "-outfile-pattern" in line, line
    assert snapshot(work) == before  # Hydra would have written into M0/rank0.log; no run folder either


def test_srun_log_dir_escapes_percent_as_slurm_documents(work, clean_env):
    from sprite.launch.plan import plan_run

    env = {**clean_env, "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n1", "SLURM_NTASKS_PER_NODE": "2"}
    plan = plan_run({"script": "t.py", "launcher": "srun", "log_dir": "M%u"}, env)
    output = next(arg for arg in plan.argv if arg.startswith("--output="))
    assert output == f"--output={work}/M%%u/rank%t.log", output
    assert plan.argv[plan.argv.index("--dir") + 1] == f"{work}/M%u"  # the follower reads the real folder


@pytest.mark.slow
def test_srun_writes_rank_logs_into_a_folder_whose_name_holds_percent(slurm, sprite_cmd, tmp_path):
    """Real Slurm 22.05: srun reads %% as %, so M%u/ gets the files and no M<user>/ appears."""
    (tmp_path / "t.py").write_text(HELLO)
    done = subprocess.run(["salloc", "-n", "2", *sprite_cmd, "run", "--accelerator", "cpu", "--log-dir", "M%u",
                           "t.py"], env=slurm.env, cwd=tmp_path, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "hello from sprite" in (tmp_path / "M%u" / "rank1.log").read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["M%u", "sprite-runs", "t.py"]


def test_srun_log_dir_with_a_backslash_is_refused(work, clean_env):
    from sprite.launch.plan import plan_run

    env = {**clean_env, "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n1", "SLURM_NTASKS_PER_NODE": "2"}
    with pytest.raises(SpriteError) as err:
        plan_run({"script": "t.py", "launcher": "srun", "log_dir": "a\\b"}, env)
    assert err.value.exit_code == 2 and "--log-dir" in str(err.value) and "srun" in str(err.value)


def test_sbatch_output_dir_with_a_pattern_is_refused(work, sprite_cmd):
    path = spec(work, {"script": "t.py", "site": "perlmutter",
                       "scheduler": {"walltime": "00:10:00", "account": "a", "output_dir": "out%u"}})
    line = refused(sprite(sprite_cmd, work, "sbatch", "--dry-run", str(path)))
    assert "job.yaml:" in line and "output_dir" in line and "%" in line, line


# --- tracebacks -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("count", ["²", "9" * 5000, "-1", " 3"])
def test_pbs_requeue_count_that_is_no_ascii_number_counts_as_zero(count):
    assert PBS().restart_count({"SPRITE_REQUEUE_COUNT": count}) == 0


def test_ranks_with_thousands_of_digits_is_one_line(work, sprite_cmd):
    line = refused(sprite(sprite_cmd, work, "run", "--dry-run", "--ranks", "9" * 5000, "t.py"))
    assert "--ranks" in line and len(line) < 2100
    path = spec(work, {"script": "t.py", "ranks": "1-" + "9" * 5000})
    line = refused(sprite(sprite_cmd, work, "run", "--dry-run", "--spec", str(path)))
    assert "job.yaml:" in line and "'ranks'" in line and "--ranks" not in line, line


@pytest.mark.parametrize("where", ["/proc/sprite-logs", "/sys/sprite-logs"])
def test_log_dir_in_a_kernel_file_system_is_refused_before_anything_is_made(work, sprite_cmd, where):
    line = refused(sprite(sprite_cmd, work, "run", "--run-dir", "R", "--log-dir", where, "t.py"))
    assert where in line and "kernel" in line, line
    assert not (work / "R").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder")
def test_log_dir_under_a_read_only_parent_is_refused(work, sprite_cmd):
    (work / "ro").mkdir()
    (work / "ro").chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        line = refused(sprite(sprite_cmd, work, "run", "--run-dir", "R", "--log-dir", "ro/logs", "t.py"))
    finally:
        (work / "ro").chmod(0o700)
    assert "not writable" in line and not (work / "R").exists()


def test_log_dir_under_a_read_only_parent_is_refused_fake_access_for_root(work, monkeypatch):
    """As root every folder is writable, so a FAKE access check answers for ro/ as another user's would."""
    from sprite.errors import UsageError
    from sprite.recovery import entry

    (work / "ro").mkdir()
    monkeypatch.setattr(os, "access", lambda path, mode: os.path.abspath(path) != str(work / "ro"))
    with pytest.raises(UsageError) as caught:
        entry.prepare({"script": "t.py", "log_dir": "ro/logs"}, None, "R")
    assert caught.value.exit_code == 2 and "is not writable for you" in str(caught.value)
    assert not (work / "R").exists() and not (work / "ro" / "logs").exists()


def fake_client(folder: Path, name: str, stdout: str, code: int = 0) -> None:
    path = folder / name
    path.write_text(f"#!/bin/sh\ncat <<'EOF'\n{stdout}\nEOF\nexit {code}\n")
    path.chmod(0o755)


@pytest.mark.parametrize("squeue, scontrol_json, scontrol_text", [
    ("[]", "[]", "JobId=5 JobName=x JobState=COMPLETED ExitCode=0:0"),
    ('{"jobs": [null]}', '{"jobs": [null, 5, "x"]}', "JobId=5 JobState=FAILED ExitCode=²:0"),
    ('{"jobs": [{"job_id": 5, "exit_code": {"return_code": "x"}, "job_state": 7}]}', "null",
     "JobId=5 ExitCode=" + "9" * 5000 + ":0"),
    ("null", '{"jobs": "x"}', "nonsense without equals"),
])
def test_status_json_of_an_unexpected_shape_is_no_traceback(work, sprite_cmd, squeue, scontrol_json, scontrol_text):
    bin_dir = work / "bin"
    bin_dir.mkdir()
    fake_client(bin_dir, "squeue", squeue)
    (bin_dir / "scontrol").write_text("#!/bin/sh\nif [ \"$1\" = --json ]; then cat <<'EOF'\n" + scontrol_json +
                                      "\nEOF\nelse cat <<'EOF'\n" + scontrol_text + "\nEOF\nfi\n")
    (bin_dir / "scontrol").chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    done = sprite(sprite_cmd, work, "status", "--json", "--scheduler", "slurm", "5", env=env)
    assert "Traceback" not in done.stderr, done.stderr
    if done.returncode == 0:
        record = json.loads(done.stdout)
        assert record["job_id"] == "5" and (record["exit_code"] is None or isinstance(record["exit_code"], int))
    else:
        refused(done)


@pytest.mark.parametrize("qstat", ['{"Jobs": {"5": "x"}}', '{"Jobs": {"5": null}}', "[]", '{"Jobs": [1]}',
                                   '{"Jobs": {"5": {"Exit_status": true, "Output_Path": 7}}}'])
def test_qstat_json_of_an_unexpected_shape_is_no_traceback(work, sprite_cmd, qstat):
    bin_dir = work / "bin"
    bin_dir.mkdir()
    fake_client(bin_dir, "qstat", qstat)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    done = sprite(sprite_cmd, work, "status", "--json", "--scheduler", "pbs", "5", env=env)
    assert "Traceback" not in done.stderr, done.stderr
    if done.returncode == 0:
        record = json.loads(done.stdout)
        assert record["exit_code"] is None and (record["log"] is None or isinstance(record["log"], str))
    else:
        refused(done)


# --- nonsense accepted ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("run_dir", ["a\nb", "a\x1b[31mb", "a\rb"])
def test_run_dir_with_control_characters_is_refused(work, sprite_cmd, run_dir):
    line = refused(sprite(sprite_cmd, work, "run", "--dry-run", "--run-dir", run_dir, "t.py"))
    assert "--run-dir" in line and "control character" in line, line


@pytest.mark.parametrize("seconds", ["1e-100", "0.001", "0.5"])
def test_stall_timeout_below_the_floor_is_refused(work, sprite_cmd, seconds):
    line = refused(sprite(sprite_cmd, work, "run", "--dry-run", "--stall-timeout", seconds, "t.py"))
    assert "--stall-timeout" in line and "at least 1" in line, line


@pytest.mark.parametrize("launcher", [["--launcher", "local"], ["--launcher", "torchrun"],
                                      ["--launcher", "mpiexec", "--mpi", "hydra"],
                                      ["--launcher", "mpiexec", "--mpi", "openmpi"]])
def test_cpu_bind_with_a_launcher_that_has_none_is_refused(work, sprite_cmd, launcher):
    line = refused(sprite(sprite_cmd, work, "run", "--dry-run", *launcher, "--cpu-bind", "list:1", "t.py"))
    assert "--cpu-bind" in line, line


def test_requeue_with_open_mode_in_extra_is_refused(work, sprite_cmd):
    path = spec(work, {"script": "t.py", "site": "perlmutter",
                       "scheduler": {"walltime": "00:10:00", "account": "a", "requeue": True,
                                     "extra": ["--open-mode=truncate"]}})
    line = refused(sprite(sprite_cmd, work, "sbatch", "--dry-run", str(path)))
    assert "job.yaml:" in line and "--open-mode" in line and "requeue" in line, line


def test_output_dir_that_is_a_file_is_refused_by_the_dry_run_too(work, sprite_cmd):
    path = spec(work, {"script": "t.py", "site": "perlmutter",
                       "scheduler": {"walltime": "00:10:00", "account": "a", "output_dir": "afile"}})
    line = refused(sprite(sprite_cmd, work, "sbatch", "--dry-run", str(path)))
    assert "afile" in line and "file" in line, line
    path = spec(work, {"script": "t.py", "site": "perlmutter",
                       "scheduler": {"walltime": "00:10:00", "account": "a", "output_dir": "afile/sub"}})
    assert "afile" in refused(sprite(sprite_cmd, work, "sbatch", "--dry-run", str(path)))


# --- messages ---------------------------------------------------------------------------------------------------

def test_secret_given_a_value_on_the_command_line_is_masked(work, sprite_cmd):
    done = sprite(sprite_cmd, work, "run", "--dry-run", "--secret", "FOO=hunter2value", "t.py")
    line = refused(done)
    assert "hunter2value" not in done.stderr + done.stdout and "FOO" in line, line


def test_literal_secret_that_fails_a_check_is_masked(work, sprite_cmd):
    done = sprite(sprite_cmd, work, "run", "--dry-run", "--env", "MY_TOKEN=hunter2\nvalue", "t.py")
    refused(done)
    assert "hunter2" not in done.stderr + done.stdout, done.stderr
    path = spec(work, {"script": "t.py", "env": {"MY_TOKEN": ["hunter2value"]}})
    done = sprite(sprite_cmd, work, "run", "--dry-run", "--spec", str(path))
    line = refused(done)
    assert "hunter2value" not in done.stderr + done.stdout and "MY_TOKEN" in line, line
    path = spec(work, {"script": "t.py", "secrets": ["A_KEY=hunter2value"]})
    done = sprite(sprite_cmd, work, "run", "--dry-run", "--spec", str(path))
    refused(done)
    assert "hunter2value" not in done.stderr + done.stdout, done.stderr


def test_log_dir_inside_the_run_dir_is_accepted(work, sprite_cmd):
    done = sprite(sprite_cmd, work, "run", "--run-dir", "RR", "--log-dir", "RR/logs", "t.py", timeout=300)
    assert done.returncode == 0, done.stderr
    assert "hello from sprite" in (work / "RR" / "logs" / "rank0.log").read_text()
    assert (work / "RR" / "audit.jsonl").is_file()


def test_nothing_is_made_before_the_checks_pass(work, sprite_cmd):
    # No srun on this PATH (nor in the venv): the launcher check must look past sprite's rank-log follower,
    # which starts srun when --log-dir is given, and refuse before the run folder or the log folder is made.
    env = {**os.environ, "PATH": "/nonexistent", "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n1",
           "SLURM_NTASKS_PER_NODE": "1"}
    done = sprite(sprite_cmd, work, "run", "--launcher", "srun", "--run-dir", "RR", "--log-dir", "RR/logs", "t.py",
                  env=env)
    assert "'srun' is not on PATH" in refused(done)
    assert not (work / "RR").exists()


def test_run_dir_and_log_dir_under_a_file_name_the_file(work, sprite_cmd):
    line = refused(sprite(sprite_cmd, work, "run", "--run-dir", "afile/x", "t.py"))
    assert "--run-dir" in line and "afile is a file" in line and "writable" not in line, line
    line = refused(sprite(sprite_cmd, work, "run", "--run-dir", "R", "--log-dir", "afile/sub", "t.py"))
    assert "--log-dir" in line and "afile is a file" in line, line
    assert not (work / "R").exists() and (work / "afile").read_text() == "mine\n"


def test_spec_log_dir_and_ranks_are_blamed_on_the_spec(work, sprite_cmd):
    path = spec(work, {"script": "t.py", "log_dir": "afile/sub"})
    line = refused(sprite(sprite_cmd, work, "run", "--run-dir", "R", "--spec", str(path)))
    assert "job.yaml:" in line and "'log_dir'" in line and "--log-dir" not in line, line
    path = spec(work, {"script": "t.py", "ranks": "5", "devices": 2})
    line = refused(sprite(sprite_cmd, work, "run", "--dry-run", "--spec", str(path)))
    assert "job.yaml:" in line and "'ranks'" in line and "--ranks" not in line.split("Name ranks")[0], line


def test_spec_site_path_is_read_from_the_specs_folder(work, sprite_cmd):
    (work / "d").mkdir()
    (work / "d" / "t.py").write_text(HELLO)
    (work / "d" / "mysite.yaml").write_text("name: mysite\nscheduler: none\n")
    path = spec(work / "d", {"script": "t.py", "site": "mysite.yaml"})
    done = sprite(sprite_cmd, work, "run", "--dry-run", "--json", "--spec", str(path))
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["env"]["SPRITE_SITE"] == "mysite"
