"""Each value of issue 10 that was accepted as nonsense, crashed or misled: refused in one bounded line naming
file, line and key (or the flag, or the variable), or read as the user meant. Planning only, in-process."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from sprite.cli import envinfo
from sprite.jobs import submit
from sprite.errors import SpecError, SpriteError, UsageError, report
from sprite.launch.plan import plan_run

REPO = Path(__file__).resolve().parents[1]
SCRIPT = str(REPO / "examples" / "train.py")


def spec(tmp_path, body: str, name: str = "job.yaml") -> str:
    path = tmp_path / name
    path.write_text(f"script: {SCRIPT}\n" + body)
    return str(path)


def refusal(call, *fragments: str) -> str:
    with pytest.raises(SpriteError) as caught:
        call()
    line = report(caught.value)
    assert caught.value.exit_code == 2 and "\n" not in line and len(line) < 2100, line
    for fragment in fragments:
        assert fragment in line, line
    return line


def run_spec(path, environ=None, **flags):
    return plan_run(flags, environ or {}, spec_file=path)


@pytest.mark.parametrize("body, fragments", [
    ("devices: 1" + "1" * 4400 + "\n", ("job.yaml:2: key 'devices'", "outside 1..1024")),
    ('devices: "²"\n', ("job.yaml:2: key 'devices'", "'²' is not a whole number")),
    ("devices: 010\n", ("job.yaml:2: key 'devices'", "leading zero")),
    ("devices: 1000000000\n", ("key 'devices'", "outside 1..1024")),
    ("1: x\n", ("job.yaml:2: key '1'", "is not a job spec key")),
    ("env: {é: 1}\n", ("key 'env'", "'é' is not a valid environment variable name")),
    ("env: {MASTER_PORT: '1234'}\n", ("key 'env'", "set by sprite itself", "--master-port")),
    ("args: \"--lr 'open\"\n", ("key 'args'", "cannot be split into words")),
    ("exclude: 'nid[001'\n", ("key 'exclude'", "unbalanced brackets")),
    ("site: frontier\n", ("job.yaml:2: key 'site'", "Unknown site 'frontier'")),
    ("site: aurora\ndevices: 209\n", ("job.yaml:3: key 'devices' = 209", "max_ranks_per_node: 208")),
])
def test_bad_spec_values_name_file_line_and_key(tmp_path, body, fragments):
    refusal(lambda: run_spec(spec(tmp_path, body)), *fragments)


def test_values_are_read_as_written(tmp_path):
    plan = run_spec(spec(tmp_path, 'args: "--lr=0.1,0.2 --tag 010"\nenv: {A: 010, B: yes, C: 1e-3}\n'))
    assert plan.argv[-3:] == ["--lr=0.1,0.2", "--tag", "010"]
    assert {k: plan.env[k] for k in "ABC"} == {"A": "010", "B": "yes", "C": "1e-3"}


@pytest.mark.parametrize("flags, fragments", [
    ({"nodes": "9" * 4400}, ("Option --nodes:", "outside 1..200000")),
    ({"devices": "²"}, ("Option --devices:", "not a whole number")),
    ({"site": "x" * 300}, ("Unknown site 'xxx", "...")),
    ({"env": {"A B": "1"}}, ("Option --env:", "not a valid environment variable name")),
])
def test_bad_flags_are_one_bounded_line(flags, fragments):
    line = refusal(lambda: plan_run({"script": SCRIPT, **flags}, {}), *fragments)
    assert len(line) < 600


@pytest.mark.parametrize("scheduler, kind, fragments", [
    ({"walltime": "00:00:00"}, "slurm", ("scheduler.walltime", "at least one second")),
    ({"walltime": "00:10:00", "preempt_signal": "USR1@99999"}, "pbs", ("scheduler.preempt_signal", "1 to 599")),
    ({"walltime": "30:00:00", "preempt_signal": "USR1@70000"}, "slurm", ("Slurm takes at most 65535 s",)),
    ({"walltime": "00:10:00", "select": "2,walltime=72:00:00"}, "pbs", ("scheduler.select", "one chunk")),
    ({"walltime": "00:10:00", "extra": ["-l walltime=72:00:00"]}, "pbs", ("scheduler.extra", "scheduler.walltime")),
    ({"walltime": "00:10:00", "extra": ["--time=72:00:00"]}, "slurm", ("scheduler.extra", "scheduler.walltime")),
    ({"walltime": "00:10:00", "python": "-c"}, "slurm", ("scheduler.python", "read as an option")),
    ({"walltime": "00:10:00", "requeue": "yes"}, "slurm", ("scheduler.requeue", "'yes' is not true or false")),
    ({"walltime": "00:10:00", "setup": ["echo 'open"]}, "slurm", ("scheduler.setup", "cannot be split")),
    ({"walltime": "00:10:00", "setup": ["export PATH=$HOME/bin"]}, "slurm", ("scheduler.setup", "trusted shell")),
    ({"walltime": "00:10:00", "nodes": 10625}, "pbs", ("scheduler.nodes", "more than aurora has (10624")),
])
def test_bad_scheduler_values_are_refused_at_submit(tmp_path, scheduler, kind, fragments):
    body = yaml.safe_dump({"site": "aurora" if kind == "pbs" else "local", "scheduler": scheduler})
    refusal(lambda: submit.prepare(spec(tmp_path, body), kind, cwd=str(tmp_path)), "job.yaml:", *fragments)


def test_setup_lines_are_trusted_shell_written_as_commands(tmp_path):
    body = "scheduler: {walltime: '00:10:00', setup: ['eval module load x', 'bash -c true', 'PATH=/opt/bin']}\n"
    text = submit.prepare(spec(tmp_path, body), "slurm", cwd=str(tmp_path)).text
    assert "\neval module load x\nbash -c true\nPATH=/opt/bin\n" in text


def test_a_folder_with_a_space_names_output_dir(tmp_path):
    folder = tmp_path / "my runs"
    folder.mkdir()
    refusal(lambda: submit.prepare(spec(tmp_path, "scheduler: {}\n"), "slurm", cwd=str(folder)),
            "scheduler.output_dir", "is the default, ./sprite-jobs")


@pytest.mark.parametrize("environ, fragments", [
    ({"PBS_JOBID": "1.x", "PBS_NODEFILE": "LIST"}, ("PBS_NODEFILE=", "line 2: 'nid001,nid002' is not a host name")),
    ({"PBS_JOBID": "1.x", "PBS_NODEFILE": "BYTES"}, ("line 2: is not a host list",)),
    ({"PBS_JOBID": "1;x", "PBS_NODEFILE": "LIST"}, ("PBS_JOBID='1;x' is not a job id",)),
    ({"PBS_JOBID": "1.x", "PBS_NODEFILE": "FIFO"}, ("PBS_NODEFILE=", "FIFO is not a regular file",)),
    ({"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "n[1-3"}, ("SLURM_JOB_NODELIST='n[1-3' cannot be read",)),
    # a variable, not a file: its host, not its line, and no word of a file written by hand
    ({"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "nid1,-nid2"}, ("SLURM_JOB_NODELIST host 2: '-nid2' is not a host",
                                                                 "The variable was set by hand")),
])
def test_broken_allocations_name_their_variable(tmp_path, environ, fragments):
    (tmp_path / "LIST").write_text("nid000\nnid001,nid002\n")
    (tmp_path / "BYTES").write_bytes(b"nid000\nnid\xff01\n")
    os.mkfifo(tmp_path / "FIFO")  # opened without O_NONBLOCK, a FIFO nobody writes to would hang the read
    environ = {k: str(tmp_path / v) if k == "PBS_NODEFILE" else v for k, v in environ.items()}
    refusal(lambda: plan_run({"script": SCRIPT, "site": "aurora"}, environ), *fragments)


def test_a_huge_allocation_is_never_listed_whole():
    environ = {"SLURM_JOB_ID": "9", "SLURM_JOB_NODELIST": "nid[00001-20000]"}
    line = refusal(lambda: plan_run({"script": SCRIPT, "nodes": 20001}, environ), "(20000 in all)")
    assert len(line) < 600
    line = refusal(lambda: plan_run({"script": SCRIPT, "exclude": ["x[1-5000]"]}, environ), "(5000 in all)")
    assert len(line) < 600


def test_a_count_sprite_cannot_read_is_not_a_crash():
    environ = {"SLURM_JOB_ID": "9", "SLURM_JOB_NODELIST": "n1", "SLURM_NTASKS_PER_NODE": "²"}
    assert plan_run({"script": SCRIPT, "devices": 2}, environ).world.devices == 2


def test_both_batch_systems_set_says_which_won(tmp_path):
    (tmp_path / "nodes").write_text("h1\n")
    environ = {"PBS_JOBID": "1.pbs", "PBS_NODEFILE": str(tmp_path / "nodes"), "SLURM_JOB_ID": "5",
               "SLURM_JOB_NODELIST": "n1"}
    plan = plan_run({"script": SCRIPT}, environ)
    assert plan.world.alloc.scheduler == "pbs" and "PBS won" in plan.notes[0]
    info = envinfo.detect(None, environ)
    assert "PBS won" in envinfo.describe(info) and info["notes"] == list(plan.notes)


def test_site_profile_values_are_checked(tmp_path):
    site = tmp_path / "mine.yaml"
    for body, fragment in (("depth: -1\n", "mine.yaml:1: key 'depth': '-1' is outside 1..1024"),
                           ("limits: {max_gpus: 2}\n", "key 'limits.max_gpus': is not a site limit"),
                           ("cpu_bind: 'a b'\n", "key 'cpu_bind'"), ("scheduler: lsf\n", "'lsf' is not a valid")):
        site.write_text(body)
        with pytest.raises(SpecError) as caught:
            plan_run({"script": SCRIPT, "site": str(site)}, {})
        assert fragment in str(caught.value), str(caught.value)


def test_the_site_is_the_flags_else_the_specs_else_sprite_site_else_local(tmp_path):
    """docs/sites.md: --site, else the spec's site:, else $SPRITE_SITE, else local."""
    from sprite.launch.plan import assemble

    spec = tmp_path / "s.job.yaml"
    spec.write_text(f"site: perlmutter\nscript: {SCRIPT}\n")
    plain = tmp_path / "p.job.yaml"
    plain.write_text(f"script: {SCRIPT}\n")
    env = {"SPRITE_SITE": "polaris"}
    assert assemble({"site": "aurora"}, str(spec), env)[1].name == "aurora"
    assert assemble({}, str(spec), env)[1].name == "perlmutter"
    assert assemble({}, str(plain), env)[1].name == "polaris"
    assert assemble({}, str(plain), {})[1].name == "local"


def test_a_submission_takes_the_site_sprite_site_names(tmp_path, monkeypatch):
    """sprite qsub/sbatch follow the same order: $SPRITE_SITE names the site of a spec without site: (they planned
    and wrote --site local, so an Aurora job ran Hydra's flags, one rank a node), and a site of another batch system
    is refused as it is for a spec's site:."""
    from sprite.jobs import submit

    spec = tmp_path / "q.yaml"
    spec.write_text(f"script: {SCRIPT}\nnodes: 2\nscheduler: {{nodes: 2, account: a, queue: debug}}\n")
    monkeypatch.setenv("SPRITE_SITE", "aurora")
    prepared = submit.prepare(str(spec), "pbs", cwd=str(tmp_path))
    assert " run --site aurora " in prepared.text and "--site local" not in prepared.text, prepared.text
    assert prepared.launch[0] == "mpiexec" and "--ppn" in prepared.launch, prepared.launch
    monkeypatch.setenv("SPRITE_SITE", "perlmutter")
    with pytest.raises(UsageError, match="The site perlmutter schedules jobs with SLURM, not PBS"):
        submit.prepare(str(spec), "pbs", cwd=str(tmp_path))
    # an allowance shorter than the site's stall timeout is refused before the job waits in the queue, as the
    # job's sprite run would refuse it
    monkeypatch.setenv("SPRITE_SITE", "aurora")
    spec.write_text(spec.read_text() + "first_step_timeout: 60\n")
    with pytest.raises(UsageError, match=r"q.yaml:\d+: key 'first_step_timeout' = 60.0 is shorter than the stall"):
        submit.prepare(str(spec), "pbs", cwd=str(tmp_path))


def test_a_site_of_another_batch_system_than_the_allocation_is_refused(tmp_path):
    """A PBS site inside a Slurm allocation planned PALS mpiexec flags there (and the other way round): refused,
    exit 2; local runs in either, and any site plans outside an allocation (a login node)."""
    nodes = tmp_path / "nodes"
    nodes.write_text("h1\nh2\n")
    slurm = {"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "nid[001-002]"}
    pbs = {"PBS_JOBID": "7.x", "PBS_NODEFILE": str(nodes)}
    for site, env, other in (("aurora", slurm, "SLURM"), ("perlmutter", pbs, "PBS")):
        with pytest.raises(UsageError, match=f"is for .* jobs, and this is a {other} allocation") as err:
            plan_run({"script": SCRIPT, "site": site}, env)
        assert err.value.exit_code == 2
    assert plan_run({"script": SCRIPT, "site": "aurora"}, pbs).argv[0] == "mpiexec"
    assert plan_run({"script": SCRIPT, "site": "perlmutter"}, slurm).argv[0] == "srun"
    assert plan_run({"script": SCRIPT, "site": "local"}, slurm).argv[0] == "srun"
    assert plan_run({"script": SCRIPT, "site": "aurora"}, {}).argv[0] == "mpiexec"


def test_errors_from_the_environment_are_usage_errors():
    with pytest.raises(UsageError, match="SPRITE_SITE=nosuch: Unknown site"):
        plan_run({"script": SCRIPT}, {"SPRITE_SITE": "nosuch"})
