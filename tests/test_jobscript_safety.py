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
