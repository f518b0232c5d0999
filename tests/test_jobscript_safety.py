"""Shell safety: every string field of a spec holding `$(touch F)` or `; touch F` is refused or stays inert.

Fields that reach a directive or a setup line must be refused; fields that reach the launch command (script
arguments, env values) are shell-quoted, which the run below proves by executing the rendered script.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from sprite.jobs import submit
from sprite.errors import SpriteError

SCHEDULER_STRINGS = ("account", "queue", "walltime", "job_name", "output_dir", "select", "place", "python",
                     "dependency", "preempt_signal", "partition", "constraint")
NOOP = "import json, os, sys\njson.dump(sys.argv[1:], open(os.environ['ARGV_OUT'], 'w'))\n"


def payloads(tmp_path, tag: str) -> list[str]:
    return [f"$(touch {tmp_path}/pwned-{tag}-a)", f"x; touch {tmp_path}/pwned-{tag}-b", f"`touch {tmp_path}/pwned-{tag}-c`"]


def write_spec(tmp_path, scheduler: dict, **job) -> str:
    (tmp_path / "noop.py").write_text(NOOP)
    spec = {"site": "local", "script": "noop.py", "devices": 1, "accelerator": "cpu", "launcher": "local",
            "scheduler": {"walltime": "00:05:00", **scheduler}, **job}
    path = tmp_path / "spec.job.yaml"
    path.write_text(yaml.safe_dump(spec))
    return str(path)


@pytest.mark.parametrize("key", SCHEDULER_STRINGS + ("setup", "extra"))
def test_every_scheduler_string_with_shell_syntax_is_refused(key, tmp_path):
    for payload in payloads(tmp_path, key):
        value = [payload] if key in ("setup", "extra") else payload
        for kind in ("pbs", "slurm"):
            with pytest.raises(SpriteError) as err:
                submit.prepare(write_spec(tmp_path, {key: value}), kind, cwd=str(tmp_path))
            message = str(err.value)
            assert f"scheduler.{key}" in message and "spec.job.yaml:" in message and "\n" not in message


@pytest.mark.parametrize("key", ["script", "site"])
def test_job_strings_with_shell_syntax_are_refused(key, tmp_path):
    for payload in payloads(tmp_path, key):
        with pytest.raises(SpriteError):
            submit.prepare(write_spec(tmp_path, {}, **{key: payload}), "slurm", cwd=str(tmp_path))


def test_newline_in_a_value_is_refused_naming_the_key(tmp_path):
    with pytest.raises(SpriteError, match="scheduler.account"):
        submit.prepare(write_spec(tmp_path, {"account": "abc\n#SBATCH --wrap=x"}), "slurm", cwd=str(tmp_path))
    with pytest.raises(SpriteError, match="control character"):
        submit.prepare(write_spec(tmp_path, {}, args=["ok\nsecond line"]), "slurm", cwd=str(tmp_path))


@pytest.mark.slow
def test_quoted_arguments_and_env_reach_the_script_literally_and_touch_nothing(tmp_path, clean_env):
    args = payloads(tmp_path, "arg")
    env = {f"P{i}": value for i, value in enumerate(payloads(tmp_path, "env"))}
    text = submit.prepare(write_spec(tmp_path, {}, args=args, env=env), "pbs", cwd=str(tmp_path)).text
    script = tmp_path / "job.pbs"
    script.write_text(text)
    run_env = {**clean_env, "ARGV_OUT": str(tmp_path / "argv.json"), "PATH": os.path.dirname(sys.executable) +
               os.pathsep + clean_env.get("PATH", "")}
    done = subprocess.run(["bash", str(script)], env=run_env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert json.loads((tmp_path / "argv.json").read_text()) == args  # the payloads arrived as plain words
    assert not list(tmp_path.glob("pwned-*")), "a payload was executed by the shell"


def test_every_run_key_of_a_spec_reaches_the_job_scripts_sprite_run(tmp_path, monkeypatch):
    """A job script's `sprite run` line carries every run key its spec wrote: the line is parsed by sprite run's
    own command line, and what it gives equals the spec's values. (Seven keys, preflight and stage among them,
    were dropped: the job ran without them.) Only the keys the job script handles another way are not flags."""
    from typer.testing import CliRunner

    from sprite.cli.app import app
    from sprite.jobs import script as jobscript
    from sprite.recovery import entry
    from sprite.spec import job as specmod
    from sprite.spec import sites, yamldoc

    train = tmp_path / "train.py"
    train.write_text("print(1)\n")
    (tmp_path / "ck").mkdir()
    written = {
        "script": str(train), "args": ["--lr", "0.1"], "nodes": 2, "devices": 4, "accelerator": "cpu",
        "strategy": "fsdp", "precision": "bf16-mixed", "launcher": "mpiexec", "mpi": "hydra", "master_port": 29511,
        "resume": str(tmp_path / "ck"), "stall_timeout": 600, "first_step_timeout": 900, "save_timeout": 1200,
        "retries": 2, "spare_nodes": 1, "preempt_signal": "USR2", "cpu_bind": "depth", "log_dir": str(tmp_path / "l"),
        "ranks": "0,3", "stage": "/tmp/stagehere", "keep_stage": True, "checkpoint_every": "30min", "mtbf": "24h",
        "keep": 3, "checkpoint_writer": "thread", "preflight": True, "requeue": True, "checks": "strict",
        "exclude": ["n3"], "env": {"FOO": "1"}, "pass_env": ["HOME"],
    }
    spec_file = tmp_path / "job.yaml"
    spec_file.write_text(yaml.safe_dump(written))
    layer = specmod.from_document(yamldoc.load(str(spec_file)))
    job = specmod.merge(layer)
    argv = jobscript.run_argv("python", sites.load("local"), layer, job)
    assert argv[:6] == ["python", "-m", "sprite", "run", "--site", "local"]
    seen = {}

    def prepare(flags, spec, run_dir, **_):
        seen.update(flags)
        raise SystemExit(0)

    monkeypatch.setattr(entry, "prepare", prepare)
    result = CliRunner().invoke(app, argv[3:])
    assert result.exit_code == 0 and seen, result.output
    parsed = specmod.from_flags({**seen, "env": None, "pass_env": None, "site": None})
    not_flags = {"env", "pass_env", "site", "scheduler"}  # --env NAME (the value is read from the spec's env again)
    assert set(layer) - not_flags <= set(parsed), sorted(set(layer) - not_flags - set(parsed))
    for key in set(layer) - not_flags:
        assert parsed[key] == layer[key], key
    assert seen["pass_env"] == ["FOO", "HOME"]

    def reparsed(extra: dict) -> tuple[list, dict]:
        spec_file.write_text(yaml.safe_dump({"script": str(train), **extra}))
        layer = specmod.from_document(yamldoc.load(str(spec_file)))
        argv = jobscript.run_argv("python", sites.load("local"), layer, specmod.merge(layer))
        seen.clear()
        result = CliRunner().invoke(app, argv[3:])
        assert result.exit_code == 0 and seen, result.output
        return argv, specmod.from_flags({**seen, "env": None, "pass_env": None, "site": None})

    # 1.1 h is 3960.0000000000005 s: written so that the flag reads it back (it was refused, more decimals than
    # a duration may have)
    argv, parsed = reparsed({"checkpoint_every": "1.1h", "mtbf": "4.1min", "stall_timeout": 600.5})
    assert abs(float(parsed["checkpoint_every"]) - 3960) < 1e-6 and abs(parsed["mtbf"] - 246) < 1e-6
    assert parsed["stall_timeout"] == 600.5
    # an mtbf alone is unused from a spec, and refused as a flag: not written (the job's run would exit 2)
    argv, parsed = reparsed({"mtbf": "24h"})
    assert "--mtbf" not in argv and "mtbf" not in parsed
    # a spec's false is written as --no-FLAG: without it the job's run took the site profile's true back
    argv, parsed = reparsed({"preflight": False, "requeue": False, "keep_stage": False})
    assert {"--no-preflight", "--no-requeue", "--no-keep-stage"} <= set(argv)
    assert (parsed["preflight"], parsed["requeue"], parsed["keep_stage"]) == (False, False, False)


def test_a_no_flag_overrides_a_site_profiles_true(tmp_path):
    """--no-preflight, --no-requeue and --no-keep-stage win over a site profile that says true (seen in the dry
    run: no preflight line, the staged copy removed, no refusal of a requeue outside a batch job)."""
    import subprocess
    import sys

    site = tmp_path / "site.yaml"
    site.write_text("name: mine\nscheduler: none\nmpi: hydra\njob:\n  accelerator: cpu\n  preflight: true\n"
                    "  requeue: true\n  keep_stage: true\n  stage: auto\n")
    (tmp_path / "train.py").write_text("print(1)\n")

    def dry(*flags):
        return subprocess.run([sys.executable, "-m", "sprite", "run", "--site", str(site), "--devices", "2",
                               *flags, "--dry-run", str(tmp_path / "train.py")], capture_output=True, text=True,
                              cwd=tmp_path, timeout=60)

    site_true = dry()
    assert site_true.returncode == 2 and "--requeue asks the batch system" in site_true.stderr, site_true.stderr
    kept = dry("--no-requeue")
    assert kept.returncode == 0 and "preflight: first" in kept.stdout and "; kept)" in kept.stdout, kept.stdout
    off = dry("--no-requeue", "--no-preflight", "--no-keep-stage")
    assert off.returncode == 0 and "preflight" not in off.stdout and "removed at the end" in off.stdout, off.stdout
