"""Secrets (issue 14): never on a command line, never in a file others can read, printed masked.

Planning and rendering run in this process; the real runs start 2 ranks through `sprite run` (sprite's local
launcher and MPICH's Hydra mpiexec) and submit through `sprite sbatch` to the single-node Slurm of
tests/slurm_cluster.py, while the test (and every rank) reads the command line of every process on the machine.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import re
import secrets as stdlib_secrets
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from slurm_cluster import slurm  # noqa: F401  (fixture)
from sprite.cli import app as cli
from sprite.integrity import owner_only
from sprite.spec import secrets as secret_env
from sprite.jobs import submit
from sprite.errors import UsageError
from sprite.integrity import IntegrityError
from sprite.launch.plan import plan_run

PROBE = str(Path(__file__).parent / "scripts" / "secret_probe.py")
VALUE = "tok-" + stdlib_secrets.token_hex(16)  # fresh per session: it can only be found where sprite put it
DIGEST = hashlib.sha256(VALUE.encode()).hexdigest()
PROBE_LINE = re.compile(r"secret-probe rank=(\d) seen=(\w+) cmdlines=(\d+)")


def sprite_main(*args: str) -> int:
    """``sprite ARGS`` in this process; returns the exit code (output goes to capsys)."""
    with pytest.raises(SystemExit) as done:
        cli.main(list(args))
    return done.value.code


def write_spec(folder: Path, name: str = "secret", **fields) -> str:
    body = {"site": "local", "script": PROBE, "args": ["MY_TOKEN", DIGEST, "0"], "devices": 2, "accelerator": "cpu",
            "scheduler": {"walltime": "00:05:00"}, **fields}
    path = folder / f"{name}.job.yaml"
    path.write_text(yaml.safe_dump(body, sort_keys=False))
    return str(path)


def cmdlines_holding(value: str) -> list[str]:
    """The command lines on this machine that contain ``value`` (any user's: /proc/PID/cmdline is world-readable)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            line = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if value.encode() in line:
            found.append(f"{pid}: {line.replace(bytes(1), b' ')[:300]!r}")
    return found


@pytest.mark.parametrize("name,expected", [
    ("HF_TOKEN", True), ("WANDB_API_KEY", True), ("wandb_api_key", True), ("DB_PASSWORD", True),
    ("MY_SECRET_SAUCE", True), ("GH_PAT", True), ("TOKENIZERS_PARALLELISM", False), ("PATH", False),
    ("KEYBOARD", False), ("PATRON", False)])
def test_default_patterns_name_the_usual_secrets(name, expected):
    assert secret_env.is_secret(name, (), secret_env.DEFAULT_PATTERNS) is expected


FLAVOURS = {  # (extra flags, site, scheduler variables): one plan per launcher flavour
    "local": ({"launcher": "local"}, "local", {}),
    "hydra": ({"launcher": "mpiexec", "mpi": "hydra"}, "local", {}),
    "openmpi": ({"launcher": "mpiexec", "mpi": "openmpi"}, "local", {}),
    "torchrun": ({"launcher": "torchrun"}, "local", {}),
    "pals": ({}, "aurora", {"PBS_JOBID": "1.pbs"}),
    "srun": ({}, "perlmutter", {"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "nid[001-002]"}),
    "torchrun-nodes": ({"launcher": "torchrun"}, "perlmutter", {"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "n[1-2]"}),
}


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_every_launcher_gets_values_through_the_environment_only(flavour, clean_env, tmp_path):
    flags, site, scheduler = FLAVOURS[flavour]
    if "PBS_JOBID" in scheduler:
        (tmp_path / "nodes").write_text("x1\nx2\n")
        scheduler = {**scheduler, "PBS_NODEFILE": str(tmp_path / "nodes")}
    environ = {**clean_env, **scheduler, "MY_TOKEN": VALUE, "PLAIN_VAR": "plain-" + VALUE[4:12]}
    plan = plan_run({**flags, "site": site, "devices": 2, "script": PROBE, "secrets": ["MY_TOKEN"],
                     "pass_env": ["PLAIN_VAR"], "env": {"LITERAL_VAR": "literal-" + VALUE[4:12]}}, environ)
    words = " ".join(plan.argv)
    assert VALUE not in words and VALUE[4:12] not in words, plan.argv
    assert plan.env["MY_TOKEN"] == VALUE and plan.env["PLAIN_VAR"] == environ["PLAIN_VAR"]
    assert json.loads(plan.to_json())["env"]["MY_TOKEN"] == "***"
    assert VALUE not in plan.to_json() and VALUE not in plan.describe() and "MY_TOKEN='***'" in plan.describe()
    assert json.loads(plan.to_json())["env"]["LITERAL_VAR"] == "literal-" + VALUE[4:12]  # not a secret: shown


def test_literal_secrets_are_refused_with_one_line_naming_them(clean_env, tmp_path, capsys):
    spec = write_spec(tmp_path, env={"WANDB_API_KEY": VALUE})
    for args in (["run", "--dry-run", "--spec", spec], ["sbatch", "--dry-run", spec], ["qsub", "--dry-run", spec]):
        assert sprite_main(*args) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "WANDB_API_KEY matches the secret pattern *_KEY" in err and VALUE not in err
    listed = write_spec(tmp_path, "listed", env={"PLAIN_NAME": VALUE}, secrets=["PLAIN_NAME"])
    assert sprite_main("run", "--dry-run", "--spec", listed) == 2
    assert "PLAIN_NAME is listed as a secret" in capsys.readouterr().err
    assert sprite_main("run", "--dry-run", "--env", f"HF_TOKEN={VALUE}", PROBE) == 2
    assert "--env NAME=VALUE gives it a literal value" in capsys.readouterr().err
    assert sprite_main("run", "--dry-run", "--json", "--allow-literal-secrets", "--spec", spec) == 0
    out = capsys.readouterr().out
    assert json.loads(out)["env"]["WANDB_API_KEY"] == "***" and VALUE not in out


def test_a_secret_written_in_the_wrong_shape_is_refused_without_its_value(clean_env, tmp_path, capsys):
    """env: as a list of NAME=VALUE (compose's form) or as text, secrets: as a mapping, pass_env: holding one, and a
    site profile's job env: as text: each is one line, exit 2, and the value is never printed (it was: a job's log
    would hold it)."""
    shapes = {"env": [f"HF_TOKEN={VALUE}"], "secrets": {"HF_TOKEN": VALUE}, "pass_env": [{"HF_TOKEN": VALUE}]}
    inline = write_spec(tmp_path, "inline", env={f"HF_TOKEN={VALUE}": None})  # env: {HF_TOKEN=value}, YAML's key
    assert sprite_main("run", "--dry-run", "--spec", inline) == 2
    err = capsys.readouterr().err
    assert "'HF_TOKEN'=*** is not a valid environment variable name" in err and VALUE not in err, err
    for key, value in {**shapes, "text": None}.items():
        spec = write_spec(tmp_path, key, **({key: value} if value is not None else {"env": f"HF_TOKEN={VALUE}"}))
        for args in (["run", "--dry-run", "--spec", spec], ["sbatch", "--dry-run", spec]):
            assert sprite_main(*args) == 2, (key, args)
            err = capsys.readouterr().err
            assert err.count("\n") == 1 and VALUE not in err and "not shown" in err, err
    site = tmp_path / "site.yaml"
    site.write_text(f"name: mine\nscheduler: none\njob:\n  env: HF_TOKEN={VALUE}\n")
    for args in (["env", "--site", str(site)], ["run", "--dry-run", "--site", str(site), PROBE]):
        assert sprite_main(*args) == 2, args
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and VALUE not in err and "not shown" in err, err


def test_a_secret_written_in_setup_or_extra_is_refused_even_with_allow_literal_secrets(clean_env, tmp_path, capsys):
    """scheduler.setup and scheduler.extra are written into the job script as they are: a secret's literal value
    there (export, -v, --export) is refused without printing it, --allow-literal-secrets or not; a reference to
    the variable and a variable that is no secret pass."""
    cases = {"setup": [f"export HF_TOKEN={VALUE}"], "extra": [f"--export=ALL,MY_API_KEY={VALUE}"],
             "quoted": [f"--export=ALL,MY_API_KEY='{VALUE}'"]}
    for where, lines in cases.items():
        key = "extra" if where == "quoted" else where  # quoted: refused as no directive word, the value hidden
        spec = write_spec(tmp_path, where, scheduler={"walltime": "00:05:00", key: lines})
        for extra in ([], ["--allow-literal-secrets"]):
            assert sprite_main("sbatch", "--dry-run", *extra, spec) == 2
            err = capsys.readouterr().err
            said = "MY_API_KEY=***" if where == "quoted" else f"scheduler.{where} gives the secret"
            assert err.count("\n") == 1 and said in err and VALUE not in err, err
    for directive, name in ((f"-v A=1,WANDB_API_KEY={VALUE}", "WANDB_API_KEY"), (f"-vWANDB={VALUE}", "WANDB")):
        pbs = write_spec(tmp_path, "pbs", secrets=["WANDB"], scheduler={"walltime": "00:05:00", "extra": [directive]})
        assert sprite_main("qsub", "--dry-run", pbs) == 2  # -vNAME=VALUE: qsub's attached form
        err = capsys.readouterr().err
        assert f"gives the secret {name} a literal" in err and VALUE not in err, err
    for where, lines in (("setup", [{"export HF_TOKEN": VALUE}]), ("extra", [f"-l walltime=01:00:00 -v HF_TOKEN={VALUE}"])):
        refused = write_spec(tmp_path, "shape", scheduler={"walltime": "00:05:00", where: lines})
        assert sprite_main("qsub", "--dry-run", refused) == 2  # refused for another reason, the value not quoted
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and VALUE not in err, err
    fine = write_spec(tmp_path, "fine", scheduler={"walltime": "00:05:00", "setup": [
        "export OMP_PLACES=cores", "module load frameworks"], "extra": ["--export=ALL,HF_TOKEN"]})
    assert sprite_main("sbatch", "--dry-run", fine) == 0, capsys.readouterr().err
    assert "export OMP_PLACES=cores" in capsys.readouterr().out


def test_a_listed_secret_missing_from_the_environment_is_refused_by_name(clean_env, tmp_path, capsys):
    assert sprite_main("run", "--dry-run", "--secret", "MY_TOKEN", PROBE) == 2
    assert "MY_TOKEN is a secret but is not set here" in capsys.readouterr().err
    assert sprite_main("run", "--dry-run", "--env", "ABSENT_VAR", PROBE) == 2
    assert "ABSENT_VAR is to be passed from this environment" in capsys.readouterr().err
    assert sprite_main("run", "--dry-run", "--secret", "1BAD", PROBE) == 2
    assert "Option --secret: '1BAD' is not an environment variable name" in capsys.readouterr().err
    if not shutil.which("sbatch"):
        pytest.skip("sbatch is not installed (CI: apt-get install slurm-wlm)")
    assert sprite_main("sbatch", write_spec(tmp_path, secrets=["MY_TOKEN"])) == 2  # checked before sbatch runs
    assert "MY_TOKEN is a secret but is not set here" in capsys.readouterr().err
    assert not (tmp_path / "sprite-jobs").exists()


def test_env_name_takes_the_value_of_the_callers_environment(clean_env, monkeypatch, capsys):
    monkeypatch.setenv("PASSED_VAR", "from-the-shell")
    monkeypatch.setenv("HF_TOKEN", VALUE)
    assert sprite_main("run", "--dry-run", "--json", "--env", "PASSED_VAR", "--env", "HF_TOKEN", PROBE) == 0
    out = capsys.readouterr().out
    assert json.loads(out)["env"] == {**json.loads(out)["env"], "PASSED_VAR": "from-the-shell", "HF_TOKEN": "***"}
    assert VALUE not in out


def test_site_profile_patterns_add_to_the_defaults(clean_env, tmp_path, capsys):
    """A profile's secret_patterns add to the defaults (they replaced them: a profile adding CORP_* let a literal
    HF_TOKEN through and printed it), an empty list included."""
    for patterns in ("['CORP_*']", "[]"):
        site = tmp_path / "corp.yaml"
        site.write_text(f"name: corp\nscheduler: none\nsecret_patterns: {patterns}\njob: {{devices: 1}}\n")
        if patterns != "[]":
            assert sprite_main("run", "--dry-run", "--site", str(site), "--env", "CORP_DB=x", PROBE) == 2
            assert "CORP_DB matches the secret pattern CORP_*" in capsys.readouterr().err
        assert sprite_main("run", "--dry-run", "--site", str(site), "--env", f"HF_TOKEN={VALUE}", PROBE) == 2
        err = capsys.readouterr().err
        assert "HF_TOKEN matches the secret pattern *_TOKEN" in err and VALUE not in err, err


@pytest.mark.parametrize("kind", ["slurm", "pbs"])
def test_job_scripts_name_variables_and_hold_no_secret(kind, clean_env, tmp_path):
    spec = write_spec(tmp_path, secrets=["MY_TOKEN"], env={"PLAIN": "a b", "HF_TOKEN": VALUE},
                      scheduler={"walltime": "00:05:00", "setup": ["umask 022"]})
    prepared = submit.prepare(spec, kind, cwd=str(tmp_path), allow_literal_secrets=True)
    text = prepared.text
    assert VALUE not in text and VALUE not in repr(prepared)
    launch = next(line for line in text.splitlines() if " -m sprite run " in line)
    assert "--env PLAIN --secret HF_TOKEN --secret MY_TOKEN" in launch and "=" not in launch.split("run", 1)[1]
    assert "export PLAIN='a b'" in text and "HF_TOKEN=" not in text
    lines = text.splitlines()  # a setup line can loosen the job's umask 077 again before sprite runs
    assert lines.index("umask 022") < lines.index(launch)
    directive = "#SBATCH --export=ALL,HF_TOKEN,MY_TOKEN" if kind == "slurm" else "#PBS -v HF_TOKEN,MY_TOKEN"
    assert directive in text.splitlines()
    assert prepared.pass_env == ("HF_TOKEN", "MY_TOKEN") and prepared.literals == {"HF_TOKEN": VALUE}
    with pytest.raises(UsageError, match=r"accent.job.yaml:\d+: key 'env': 'CAFÉ' is not a valid environment"):
        submit.prepare(write_spec(tmp_path, "accent", env={"CAFÉ": "x"}), kind, cwd=str(tmp_path))


@pytest.mark.parametrize("kind", ["slurm", "pbs"])
def test_a_site_profiles_literal_secret_allowed_at_submission_is_allowed_in_the_job(kind, clean_env, tmp_path):
    """docs/secrets.md: --allow-literal-secrets lets a site profile give a secret a literal value. The job reads the
    profile again, so its own `sprite run` gets the flag too: the job's launch line plans (dry run) with exit 0."""
    site = tmp_path / "lab.yaml"
    site.write_text(f"name: lab\nscheduler: {kind}\njob: {{devices: 1, env: {{LAB_API_KEY: literal}}}}\n")
    spec = write_spec(tmp_path, site=str(site), devices=1)
    with pytest.raises(UsageError, match="LAB_API_KEY matches the secret pattern"):
        submit.prepare(spec, kind, cwd=str(tmp_path))
    launch = next(line for line in submit.prepare(spec, kind, cwd=str(tmp_path), allow_literal_secrets=True)
                  .text.splitlines() if " -m sprite run " in line)
    words = shlex.split(launch)
    assert "--allow-literal-secrets" in words
    inner = words[words.index("run") + 1:]
    assert sprite_main("run", "--dry-run", *inner) == 0
    assert sprite_main("run", "--dry-run", *[w for w in inner if w != "--allow-literal-secrets"]) == 2
    prepared = submit.prepare(write_spec(tmp_path, "plain", devices=1), kind, cwd=str(tmp_path),
                              allow_literal_secrets=True)
    plain = next(line for line in prepared.text.splitlines() if " -m sprite run " in line)
    assert "--allow-literal-secrets" not in plain  # only where the profile gives a literal


def test_a_site_profiles_literal_secret_is_refused_by_sprite_run_naming_the_profile(clean_env, tmp_path, capsys):
    """docs/secrets.md: a literal value for a secret in a site profile is refused with one line (exit 2)."""
    site = tmp_path / "lab.yaml"
    site.write_text("name: lab\nscheduler: none\njob: {devices: 1, env: {LAB_API_KEY: literal}}\n")
    assert sprite_main("run", "--dry-run", "--site", str(site), PROBE) == 2
    err = capsys.readouterr().err
    assert "LAB_API_KEY" in err and "the site profile" in err and err.count("\n") == 1, err
    assert sprite_main("run", "--dry-run", "--allow-literal-secrets", "--site", str(site), PROBE) == 0


@pytest.mark.parametrize("kind, directive", [("slurm", "#SBATCH --export=ALL,P_PATH"), ("pbs", "#PBS -v P_PATH")])
def test_pass_env_names_go_into_the_submit_directive(kind, directive, clean_env, tmp_path):
    """docs/secrets.md: each pass_env name is named in the job script's directive, its value never written."""
    text = submit.prepare(write_spec(tmp_path, pass_env=["P_PATH"]), kind, cwd=str(tmp_path)).text
    assert directive in text.splitlines()
    assert "--env P_PATH" in text


def _modes(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root.parent)): oct(stat.S_IMODE(p.lstat().st_mode)) for p in [root, *root.rglob("*")]}


def test_owner_only_outputs_whatever_the_umask(tmp_path):
    (tmp_path / "theirs").mkdir(mode=0o755)
    os.chmod(tmp_path / "theirs", 0o755)
    old = os.umask(0)
    try:
        owner_only.make_dirs(tmp_path / "theirs" / "a" / "b")
        owner_only.make_dirs(tmp_path / "theirs" / "a" / "b")  # existing folders are fine
        with owner_only.open_log(tmp_path / "theirs" / "a" / "run.log") as log:
            log.write(b"one\n")
        with owner_only.open_log(tmp_path / "theirs" / "a" / "run.log") as log:
            log.write(b"two\n")
        ranks = subprocess.run([sys.executable, "-m", "sprite.launch.supervisor", "--nproc", "2", "--log-dir",
                                str(tmp_path / "logs" / "x"), "--", sys.executable, "-c", "print('hi')"],
                               capture_output=True, text=True, timeout=120)
    finally:
        os.umask(old)
    assert ranks.returncode == 0, ranks.stderr
    assert stat.S_IMODE((tmp_path / "theirs").stat().st_mode) == 0o755  # not sprite's: never chmodded
    assert _modes(tmp_path / "theirs" / "a") == {"a": "0o700", "a/b": "0o700", "a/run.log": "0o600"}
    assert (tmp_path / "theirs" / "a" / "run.log").read_bytes() == b"one\ntwo\n"
    assert _modes(tmp_path / "logs") == {"logs": "0o700", "logs/x": "0o700", "logs/x/rank0.log": "0o600",
                                         "logs/x/rank1.log": "0o600"}
    (tmp_path / "link.log").symlink_to(tmp_path / "theirs" / "a" / "run.log")
    with pytest.raises(OSError):
        owner_only.open_log(tmp_path / "link.log")
    os.mkfifo(tmp_path / "fifo.log")  # refused at once: opening it for writing used to wait for a reader
    started = time.monotonic()
    with pytest.raises(OSError, match="not a regular file"):
        owner_only.open_log(tmp_path / "fifo.log")
    reader = os.open(tmp_path / "fifo.log", os.O_RDONLY | os.O_NONBLOCK)  # one that a process reads: refused too
    try:
        with pytest.raises(OSError, match="not a regular file"):
            owner_only.open_log(tmp_path / "fifo.log")
    finally:
        os.close(reader)
    assert time.monotonic() - started < 5


def test_parity_results_are_owner_only_whatever_the_umask(clean_env, tmp_path):
    from sprite.parity import store
    from sprite.parity.check import report
    from sprite.parity.check.runner import claim_dir
    from sprite.parity.settings import Settings

    out = tmp_path / "runs" / "fp32"
    old = os.umask(0)
    try:
        claim_dir(out, Settings(devices=2))
        store.claim(out / "fault_x" / "ddp", 0)
        store.write_rank(out / "fault_x" / "ddp", 0, {"steps": []})
        report.write_json(out / "report.json", {"verdict": "pass"})
    finally:
        os.umask(old)
    assert _modes(tmp_path / "runs") == {
        "runs": "0o700", "runs/fp32": "0o700", "runs/fp32/run.json": "0o600",
        "runs/fp32/run.json.sprite-manifest.json": "0o600", "runs/fp32/fault_x": "0o700",
        "runs/fp32/fault_x/ddp": "0o700", "runs/fp32/fault_x/ddp/rank0.json": "0o600",
        "runs/fp32/report.json": "0o600"}
    (out / "other.json.tmp").symlink_to(out / "run.json")  # a leftover temporary name is never written through
    with pytest.raises(IntegrityError):
        report.write_json(out / "other.json", {})


def test_sprite_env_shows_secret_names_and_masks_values(clean_env, tmp_path, monkeypatch, capsys):
    site = tmp_path / "lab.yaml"
    site.write_text(f"name: lab\nscheduler: none\njob: {{env: {{LAB_API_KEY: {VALUE}, LAB_MODE: fast}}}}\n")
    monkeypatch.setenv("HF_TOKEN", VALUE)
    assert sprite_main("env", "--json", "--site", str(site)) == 0
    out = capsys.readouterr().out
    info = json.loads(out)
    assert info["env"] == {"LAB_API_KEY": "***", "LAB_MODE": "fast"} and "HF_TOKEN" in info["secrets_here"]
    assert sprite_main("env", "--site", str(site)) == 0
    assert VALUE not in out + capsys.readouterr().out


def _probe_lines(text: str) -> list[tuple[str, str, str]]:
    return sorted(PROBE_LINE.findall(text))


@pytest.mark.slow
@pytest.mark.parametrize("launcher", [["--launcher", "local"], ["--launcher", "mpiexec", "--mpi", "hydra"]],
                         ids=["local", "mpich-hydra"])
def test_two_ranks_see_the_secret_and_no_command_line_holds_it(launcher, sprite_cmd, clean_env, tmp_path):
    log = tmp_path / "run.log"
    with open(log, "wb") as sink:
        proc = subprocess.Popen([*sprite_cmd, "run", "--devices", "2", *launcher, "--secret", "MY_TOKEN", PROBE,
                                 "MY_TOKEN", DIGEST, "3"], env={**clean_env, "MY_TOKEN": VALUE}, cwd=tmp_path,
                                stdout=sink, stderr=subprocess.STDOUT)
        found, scans_while_ranks_held = [], 0
        deadline = time.monotonic() + 400
        while proc.poll() is None and time.monotonic() < deadline:
            ready = len(_probe_lines(log.read_text(errors="replace"))) == 2  # both ranks alive, holding
            found += cmdlines_holding(VALUE)
            scans_while_ranks_held += ready and proc.poll() is None
            time.sleep(0.05)
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    text = log.read_text(errors="replace")
    assert proc.returncode == 0, text[-3000:]
    assert _probe_lines(text) == [("0", "True", "0"), ("1", "True", "0")], text[-3000:]
    assert found == [] and scans_while_ranks_held > 0


@pytest.mark.slow
def test_sbatch_passes_a_listed_secret_by_name_and_writes_it_nowhere(slurm, sprite_cmd, tmp_path):
    spec = write_spec(tmp_path, secrets=["MY_TOKEN"], env={"PLAIN": "shown"},
                      scheduler={"walltime": "00:05:00", "output_dir": "out/jobs"})
    env = {**slurm.env, "MY_TOKEN": VALUE}
    dry = subprocess.run([*sprite_cmd, "sbatch", "--dry-run", spec], env=env, capture_output=True, text=True,
                         timeout=120)
    assert dry.returncode == 0 and VALUE not in dry.stdout and "#SBATCH --export=ALL,MY_TOKEN" in dry.stdout
    done = subprocess.run([*sprite_cmd, "sbatch", spec], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, umask=0)  # the most permissive umask: sprite's outputs are owner-only anyway
    assert done.returncode == 0, done.stdout + done.stderr
    job_id = re.search(r"submitted \w+ job (\S+)", done.stdout).group(1)
    info = slurm.wait_state(job_id, ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"), timeout=240)
    out = tmp_path / "out"
    log = out / "jobs" / f"secret-1-{job_id}.log"
    text = log.read_text(errors="replace")
    assert info["JobState"] == "COMPLETED", text[-3000:]
    assert _probe_lines(text) == [("0", "True", "0"), ("1", "True", "0")], text[-3000:]
    assert text.count("umask=0o77") == 2  # the job runs with the submit command's umask 077, as PBS Pro's jobs do
    modes = _modes(out)
    assert modes == {"out": "0o700", "out/jobs": "0o700", "out/jobs/secret-1.sbatch": "0o600",
                     f"out/jobs/secret-1-{job_id}.log": "0o600"}
    assert not [p for p in out.rglob("*") if p.is_file() and VALUE.encode() in p.read_bytes()]
