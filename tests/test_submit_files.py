"""Nothing the user owns is lost by sprite qsub / sbatch, and every scheduler client call has a deadline.

The data-loss cases run `sprite sbatch` against the real single-node Slurm (tests/slurm_cluster.py), with
held jobs (`--hold`) so nothing starts; the client deadline and output decoding use small fake clients (shell
scripts named as fakes) on PATH, in-process.
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from slurm_cluster import slurm  # noqa: F401  (fixture)
from sprite.jobs import clients
from sprite.jobs import files as jobfiles
from sprite.jobs import submit
from sprite.errors import SpriteError, UsageError, report

REPO = Path(__file__).resolve().parents[1]


def write_spec(folder: Path, name: str = "train", **scheduler) -> str:
    (folder / "noop.py").write_text("print('noop')\n")
    body = {"site": "local", "script": "noop.py", "devices": 1, "accelerator": "cpu",
            "scheduler": {"walltime": "00:05:00", **scheduler}}
    path = folder / f"{name}.job.yaml"
    path.write_text(yaml.safe_dump(body))
    return str(path)


def snapshot(folder: Path) -> dict:
    """Every entry under ``folder``: a symlink's target, else a file's bytes and mode (never following links)."""
    out = {}
    for path in sorted(folder.rglob("*")):
        info = os.lstat(path)
        key = str(path.relative_to(folder))
        if stat.S_ISLNK(info.st_mode):
            out[key] = ("link", os.readlink(path))
        elif stat.S_ISREG(info.st_mode):
            out[key] = ("file", path.read_bytes(), stat.S_IMODE(info.st_mode))
        else:
            out[key] = ("dir",)
    return out


def fake_client(bin_dir: Path, name: str, body: str) -> None:
    """A FAKE scheduler client: a shell script standing in for ``name``."""
    bin_dir.mkdir(exist_ok=True)
    path = bin_dir / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)


@pytest.fixture
def fake_bin(tmp_path, monkeypatch) -> Path:
    bin_dir = tmp_path / "bin"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return bin_dir


def test_ctrl_c_while_the_client_runs_keeps_the_script_and_says_the_job_may_exist(tmp_path, fake_bin, sprite_cmd):
    """A real `sprite sbatch` interrupted (SIGINT) while a FAKE sbatch runs: the job may exist already (and its
    requeue submits this script again), so the script stays, the line says so, and the exit is 130."""
    import signal
    import sys

    started = tmp_path / "client.started"
    fake_client(fake_bin, "sbatch", f"touch {started}\nsleep 60\n")
    spec = write_spec(tmp_path)
    env = {**os.environ, "PATH": f"{fake_bin}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}"
           f"{os.environ['PATH']}"}
    proc = subprocess.Popen([*sprite_cmd, "sbatch", spec], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not started.exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    lines = err.strip().splitlines()
    assert proc.returncode == 130 and len(lines) == 1, err
    assert "Interrupted while sbatch ran" in lines[0] and "may have been submitted" in lines[0], lines
    kept = re.search(r"the script stays at (\S+?)\.?$", lines[0])
    assert kept and Path(kept.group(1)).is_file(), lines[0]


def test_an_interrupt_before_the_client_runs_removes_what_it_wrote(tmp_path, fake_bin, monkeypatch):
    fake_client(fake_bin, "sbatch", "echo 'Submitted batch job 1'\n")
    prepared = submit.prepare(write_spec(tmp_path, output_dir="out/jobs"), "slurm", cwd=str(tmp_path))
    before = snapshot(tmp_path)
    monkeypatch.setattr(jobfiles, "write_script", lambda *args: (_ for _ in ()).throw(KeyboardInterrupt()))
    with pytest.raises(KeyboardInterrupt):
        submit.submit(prepared)
    assert snapshot(tmp_path) == before  # nothing was asked of the scheduler: nothing is left


def test_a_hung_client_is_stopped_with_everything_it_started(tmp_path, fake_bin, monkeypatch):
    pid_file = tmp_path / "sleeper.pid"
    fake_client(fake_bin, "sbatch", f"sleep 120 &\necho $! > {pid_file}\nwait\n")
    assert clients.TIMEOUT == 60.0  # docs/jobs.md: every client call gets 60 s
    monkeypatch.setattr(clients, "TIMEOUT", 1.0)
    prepared = submit.prepare(write_spec(tmp_path), "slurm", cwd=str(tmp_path))
    start = time.monotonic()
    with pytest.raises(clients.ClientTimeout) as caught:
        submit.submit(prepared)
    assert time.monotonic() - start < 20
    line = report(caught.value)
    assert "did not answer within 1 s" in line and "may have been submitted" in line, line
    assert Path(prepared.script_path).is_file()  # the job may exist: its script stays
    sleeper = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _running(sleeper):
        time.sleep(0.1)
    assert not _running(sleeper), "the client's child outlived the deadline"


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def test_client_output_that_is_not_utf8_is_read_and_escaped(tmp_path, fake_bin):
    fake_client(fake_bin, "squeue", r"printf '12 tr\377\376in \033[2J RUNNING 0:01 5:00 1 n1\n'" + "\n")
    text = clients.status("12", clients.pick("slurm", None))
    assert "tr\ufffd\ufffdin \\x1b[2J RUNNING" in text and "\x1b" not in text  # a job name cannot clear a screen


def test_a_refused_submission_leaves_the_users_files_as_they_were(tmp_path, fake_bin):
    fake_client(fake_bin, "sbatch", "echo 'sbatch: error: \033[31mInvalid account\033[0m' >&2\nexit 1\n")
    spec = write_spec(tmp_path, output_dir="out/new")
    before = snapshot(tmp_path)
    with pytest.raises(UsageError) as caught:
        submit.submit(submit.prepare(spec, "slurm", cwd=str(tmp_path)))
    line = report(caught.value)
    assert "Invalid account" in line and "\\x1b[31m" in line and "\x1b" not in line, line
    assert snapshot(tmp_path) == before  # no script left behind, and the folders it made are gone


@pytest.mark.parametrize("kind, client, said", [("slurm", "sbatch", "Submitted batch job 77"),
                                               ("pbs", "qsub", "77.server")])
def test_a_literal_secret_allowed_reaches_the_client_through_its_environment_only(tmp_path, fake_bin, kind, client,
                                                                                     said):
    """docs/secrets.md: a spec's literal secret allowed by --allow-literal-secrets goes to sbatch/qsub through their
    environment, not into the script (a FAKE client records the value it was given)."""
    import secrets as stdlib_secrets

    value = "tok-" + stdlib_secrets.token_hex(12)
    fake_client(fake_bin, client, f'printf %s "$HF_TOKEN" > "{tmp_path}/seen"\necho {said}\n')
    spec = Path(write_spec(tmp_path))
    body = yaml.safe_load(spec.read_text())
    spec.write_text(yaml.safe_dump({**body, "env": {"HF_TOKEN": value}}))
    job_id, prepared = submit.submit(submit.prepare(str(spec), kind, cwd=str(tmp_path), allow_literal_secrets=True))
    assert job_id == "77" or job_id == "77.server"
    assert (tmp_path / "seen").read_text() == value
    assert value not in Path(prepared.script_path).read_text() and "HF_TOKEN" in Path(prepared.script_path).read_text()


def test_every_pbs_submission_gets_its_own_script_and_log(tmp_path, fake_bin):
    fake_client(fake_bin, "qsub", "echo 4242.server\n")
    spec = write_spec(tmp_path)
    done = [submit.submit(submit.prepare(spec, "pbs", cwd=str(tmp_path)))[1] for _ in range(2)]
    assert [Path(p.script_path).name for p in done] == ["train-1.pbs", "train-2.pbs"]
    assert [Path(p.log_path).name for p in done] == ["train-1.log", "train-2.log"]
    assert f"#PBS -o {done[1].log_path}\n" in Path(done[1].script_path).read_text()
    assert stat.S_IMODE(os.stat(done[0].script_path).st_mode) == 0o600  # owner-only (sprite.integrity.owner_only)


@pytest.mark.parametrize("output_dir, fragment", [
    ("afile", "afile is a file, not a folder"), ("afile/sub", "afile is a file, not a folder"),
    ("/proc/self", "under /proc, a kernel file system"), ("/sys/kernel", "under /sys"),
])
def test_an_output_folder_that_cannot_hold_files_is_one_line(tmp_path, fake_bin, output_dir, fragment):
    fake_client(fake_bin, "sbatch", "echo 1\n")
    (tmp_path / "afile").write_text("mine\n")
    with pytest.raises(SpriteError) as caught:  # prepare refuses it, so the dry run does too (issue 32)
        submit.submit(submit.prepare(write_spec(tmp_path, output_dir=output_dir), "slurm", cwd=str(tmp_path)))
    line = report(caught.value)
    assert caught.value.exit_code == 2 and fragment in line and "scheduler.output_dir" in line, line
    assert (tmp_path / "afile").read_text() == "mine\n"


def test_a_rank_log_folder_the_run_would_refuse_is_refused_before_the_job_is_queued(tmp_path, fake_bin):
    """sprite run --spec refuses such a log_dir at once; the job script's run would do it after the queue wait."""
    fake_client(fake_bin, "sbatch", "echo 1\n")
    spec = write_spec(tmp_path)
    body = yaml.safe_load(Path(spec).read_text())
    Path(spec).write_text(yaml.safe_dump({**body, "log_dir": "/proc/sprite-logs"}))
    with pytest.raises(UsageError) as caught:
        submit.prepare(spec, "slurm", cwd=str(tmp_path))
    assert "key 'log_dir'" in report(caught.value) and "under /proc, a kernel file system" in report(caught.value)


def test_an_unwritable_output_folder_is_one_line(tmp_path, fake_bin, monkeypatch):
    fake_client(fake_bin, "sbatch", "echo 1\n")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    if os.geteuid() == 0:  # root may write anywhere: a FAKE access check answers as any other user's would
        monkeypatch.setattr(jobfiles.os, "access", lambda path, mode: os.path.abspath(path) != str(locked))
    with pytest.raises(UsageError) as caught:  # prepare refuses it, so the dry run does too (issue 32)
        submit.submit(submit.prepare(write_spec(tmp_path, output_dir="locked"), "slurm", cwd=str(tmp_path)))
    assert "locked is not writable for you" in report(caught.value) and not any(locked.iterdir())


@pytest.mark.parametrize("body, fragments", [
    ("strategy: single\ndevices: 2\n", ("job.yaml:2: key 'strategy' = single runs one rank", "1 node(s) x 2")),
    ("exclude: [nid001, nid002]\nscheduler: {nodes: 2}\n", ("job.yaml:2: key 'exclude' removes every host of the "
                                                             "requested SLURM allocation",)),
    ("exclude: [a, b]\nscheduler: {nodes: 1}\n", ("key 'exclude' names 2 hosts, more than the 1 node(s)",)),
    ("nodes: 2\nexclude: [nid001]\nscheduler: {nodes: 2}\n", ("key 'nodes' = 2 asks for more nodes than the "
                                                              "requested SLURM allocation has (1",)),
    ("launcher: mpiexec\nmpi: nosuch\n", ("key 'mpi'", "not a valid choice")),
])
def test_submission_plans_the_launch_first(tmp_path, body, fragments):
    """The launch inside the job is planned for the requested allocation before anything is written."""
    (tmp_path / "job.yaml").write_text(f"script: {REPO / 'examples' / 'train.py'}\n" + body +
                                       ("" if "scheduler" in body else "scheduler: {}\n"))
    with pytest.raises(SpriteError) as caught:
        submit.prepare(str(tmp_path / "job.yaml"), "slurm", cwd=str(tmp_path))
    line = report(caught.value)
    assert all(fragment in line for fragment in fragments), line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["job.yaml"]


def sbatch(sprite_cmd, cluster, cwd, spec) -> subprocess.CompletedProcess:
    return subprocess.run([*sprite_cmd, "sbatch", spec], env=cluster.env, cwd=cwd, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.slow
def test_sbatch_never_replaces_follows_or_chmods_a_users_file(slurm, sprite_cmd, tmp_path):
    spec = write_spec(tmp_path, output_dir=".", extra=["--hold"])  # held: the jobs never start
    (tmp_path / "train.sbatch").write_text("#!/bin/sh\necho my own script\n")
    (tmp_path / "train.sbatch").chmod(0o644)
    target = tmp_path / "elsewhere.txt"
    target.write_text("precious\n")
    target.chmod(0o640)
    (tmp_path / "train-1.sbatch").symlink_to(target)
    before = snapshot(tmp_path)
    jobs = []
    try:
        for expect in ("train-2", "train-3"):
            done = sbatch(sprite_cmd, slurm, tmp_path, spec)
            assert done.returncode == 0, done.stderr
            job_id = re.search(r"submitted \w+ job (\d+)", done.stdout).group(1)
            jobs.append(job_id)
            assert re.search(rf"^script\s+{tmp_path}/{expect}\.sbatch$", done.stdout, re.M), done.stdout
            assert re.search(rf"^log\s+{tmp_path}/{expect}-{job_id}\.log$", done.stdout, re.M), done.stdout
            assert slurm.job(job_id)["StdOut"] == f"{tmp_path}/{expect}-{job_id}.log"
        after = snapshot(tmp_path)
        assert {key: after[key] for key in before} == before  # the script, the symlink and its target as they were
        assert sorted(set(after) - set(before)) == ["train-2.sbatch", "train-3.sbatch"]
    finally:
        if jobs:
            subprocess.run(["scancel", *jobs], env=slurm.env, capture_output=True, timeout=60)


@pytest.mark.slow
def test_a_submission_slurm_refuses_leaves_everything_as_it_was(slurm, sprite_cmd, tmp_path):
    spec = write_spec(tmp_path, partition="nosuchpartition", output_dir="jobs/new")
    (tmp_path / "train.sbatch").write_text("mine\n")
    before = snapshot(tmp_path)
    done = sbatch(sprite_cmd, slurm, tmp_path, spec)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1 and "sbatch" in lines[0] and "partition" in lines[0], done.stderr
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("kind, line", [("pbs", "#PBS -W depend=afterok:123:456\n"),
                                        ("slurm", "#SBATCH --dependency=afterok:123:456\n")])
def test_a_dependency_waits_for_the_jobs_named_to_succeed(tmp_path, kind, line):
    """docs/jobs.md: `dependency: afterok:ID` (IDs joined by ':') starts the job only after those succeeded."""
    text = submit.prepare(write_spec(tmp_path, dependency="afterok:123:456"), kind, cwd=str(tmp_path)).text
    assert [found + "\n" for found in text.splitlines() if found.startswith(("#PBS -W", "#SBATCH --dep"))] == [line]


@pytest.mark.parametrize("kind, stdout, job_id", [
    ("slurm", "Submitted batch job 4242\n", "4242"), ("slurm", "4242;cluster2\n", "4242"),
    ("slurm", "Submitted batch job 4242 on cluster c1\n", "4242"), ("pbs", "8505298.aurora-pbsadmin-0001\n",
                                                                      "8505298.aurora-pbsadmin-0001"),
    ("pbs", "77[].pbs\n", "77[].pbs"), ("slurm", "all good, I think\n", ""), ("pbs", "", ""),
])
def test_the_job_id_is_the_submit_outputs_last_word_that_starts_with_a_digit(kind, stdout, job_id):
    from sprite import schedulers

    assert schedulers.get(kind).parse_job_id(stdout) == job_id


def test_a_client_that_prints_no_job_id_keeps_the_script_and_says_to_check_the_queue(tmp_path, fake_bin):
    """A submit command that exits 0 but prints no job id may still have queued the job: exit 2, one line, and
    the script stays for the user to check against the queue."""
    fake_client(fake_bin, "sbatch", "echo 'all good, I think'\n")  # a FAKE sbatch
    prepared = submit.prepare(write_spec(tmp_path), "slurm", cwd=str(tmp_path))
    with pytest.raises(UsageError) as caught:
        submit.submit(prepared)
    line = report(caught.value)
    assert "printed no job id" in line and "all good, I think" in line and "Check its queue" in line, line
    assert caught.value.exit_code == 2 and "\n" not in line
    assert Path(prepared.script_path).is_file()


def test_a_file_made_at_the_scripts_name_after_planning_is_kept_and_the_next_name_used(tmp_path, fake_bin):
    """docs/jobs.md: a script name is never replaced; one taken between planning and writing (another submission,
    the user) is kept byte for byte and the script goes to the first free number after it."""
    fake_client(fake_bin, "sbatch", "echo 'Submitted batch job 77'\n")  # a FAKE sbatch
    prepared = submit.prepare(write_spec(tmp_path), "slurm", cwd=str(tmp_path))
    taken = Path(prepared.script_path)
    taken.parent.mkdir(parents=True, exist_ok=True)
    taken.write_text("the user's own file\n")
    job_id, submitted = submit.submit(prepared)
    assert job_id == "77" and taken.read_text() == "the user's own file\n"
    assert submitted.script_path != prepared.script_path and Path(submitted.script_path).is_file()
    assert re.search(r"-(\d+)\.sbatch$", submitted.script_path).group(1) == str(
        int(re.search(r"-(\d+)\.sbatch$", prepared.script_path).group(1)) + 1)


def test_a_slurm_log_left_from_an_earlier_job_keeps_its_number_from_being_reused(tmp_path, fake_bin):
    """docs/jobs.md: n is the first number not yet used. A Slurm log is named by the job id sbatch fills in
    (``train-1-%j.log``), so a log left alone (its script deleted) still takes its number."""
    fake_client(fake_bin, "sbatch", "echo 'Submitted batch job 78'\n")  # a FAKE sbatch
    folder = tmp_path / "sprite-jobs"
    folder.mkdir()
    (folder / "train-1-77.log").write_text("the earlier job's log\n")
    (folder / "train-3.sbatch").write_text("the user's own script\n")
    prepared = submit.prepare(write_spec(tmp_path), "slurm", cwd=str(tmp_path))
    job_id, submitted = submit.submit(prepared)
    assert (job_id, Path(submitted.script_path).name) == ("78", "train-2.sbatch")
    assert submitted.log_path.endswith("/train-2-%j.log")
    assert (folder / "train-1-77.log").read_text() == "the earlier job's log\n"


@pytest.mark.parametrize("kind, client", [("pbs", "qsub"), ("slurm", "sbatch")])
def test_the_submit_command_runs_under_umask_077(tmp_path, fake_bin, kind, client):
    """docs/secrets.md: sbatch and qsub run with umask 077, so what the batch system writes for the job (its log)
    is owner-only whatever the submitting shell's umask. A FAKE client records the umask it was started with."""
    seen = tmp_path / "umask.txt"
    fake_client(fake_bin, client, f"umask > {seen}\necho 'Submitted batch job 91'\n")
    old = os.umask(0o022)
    try:
        submit.submit(submit.prepare(write_spec(tmp_path), kind, cwd=str(tmp_path)))
    finally:
        os.umask(old)
    assert seen.read_text().strip() == "0077"


def test_an_output_dir_that_is_a_symlink_to_a_folder_is_used_as_that_folder(tmp_path, fake_bin):
    """docs/jobs.md: a symlink given as scheduler.output_dir is the user's own choice of folder (scratch linked from
    home, as on Aurora): the new files go into its target; nothing there is replaced and the link stays."""
    fake_client(fake_bin, "sbatch", "echo 'Submitted batch job 93'\n")  # a FAKE sbatch
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    (scratch / "train-1.sbatch").write_text("the user's own\n")
    (tmp_path / "jobs").symlink_to(scratch)
    _, submitted = submit.submit(submit.prepare(write_spec(tmp_path, output_dir="jobs"), "slurm", cwd=str(tmp_path)))
    assert Path(submitted.script_path).name == "train-2.sbatch" and (scratch / "train-2.sbatch").is_file()
    assert (scratch / "train-1.sbatch").read_text() == "the user's own\n" and (tmp_path / "jobs").is_symlink()


def test_pbs_status_and_cancel_ask_qstat_and_qdel_for_the_job(tmp_path, fake_bin):
    """docs/jobs.md: `sprite status` runs qstat and `sprite cancel` qdel on the job id (FAKE clients recording
    their arguments); a refusal is one line, exit 2."""
    from sprite import schedulers

    record = tmp_path / "argv.txt"
    fake_client(fake_bin, "qstat", f'echo "qstat $*" >> {record}\necho "Job id  Name  State"\necho "9.x  t  R"\n')
    fake_client(fake_bin, "qdel", f'echo "qdel $*" >> {record}\n')
    pbs = schedulers.get("pbs")
    assert clients.status("9.x", pbs) == "Job id  Name  State\n9.x  t  R"
    clients.cancel("9.x", pbs)
    assert record.read_text().splitlines() == ["qstat 9.x", "qdel 9.x"]
    fake_client(fake_bin, "qdel", "echo 'qdel: Unknown Job Id 10.x' >&2\nexit 1\n")
    with pytest.raises(UsageError) as caught:
        clients.cancel("10.x", pbs)
    line = report(caught.value)
    assert "qdel 10.x failed (exit 1): qdel: Unknown Job Id 10.x" in line and caught.value.exit_code == 2
