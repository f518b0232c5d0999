"""Typer conventions: typed integers and fixed choices in --help, --version and shell completion. The command
shape of `sprite parity`, `sprite bench` and `sprite ckpt-check` is tested in tests/test_parity_cli.py."""

from __future__ import annotations

import os
import re
import shlex
import subprocess

from typer.testing import CliRunner

from sprite.cli import app as cli
from sprite.parity.check.faults import FAULTS


def help_text(*args: str) -> str:
    result = CliRunner().invoke(cli.app, [*args, "--help"])
    assert result.exit_code == 0, result.output
    return result.output


def test_run_help_shows_integers_and_the_allowed_values():
    text = help_text("run")
    for option in ("--nodes", "--devices", "--master-port", "--retries", "--spare-nodes"):
        assert re.search(rf"{option}\s+(INTEGER|<int>)", text), option
    for option in ("--stall-timeout", "--first-step-timeout", "--save-timeout"):
        assert re.search(rf"{option}\s+FLOAT", text), option
    flat = " ".join(re.sub(r"[│|]", " ", text).split())  # the help's table, wrapped lines joined
    assert "default 10x --stall-timeout, at least 300" in flat  # as Limits.from_options computes it
    for option, values in (("--strategy", "auto|single|ddp|fsdp"), ("--accelerator", "auto|xpu|cuda|cpu"),
                           ("--launcher", "auto|mpiexec|srun|torchrun|local"), ("--mpi", "auto|pals|hydra|openmpi")):
        assert re.search(rf"{option}\s+[<\[]{re.escape(values)}[>\]]", text), option
    assert "32-true|32|bf16-mixed" in text


def test_parity_fault_help_lists_the_six_faults():
    text = " ".join(help_text("parity").split())
    assert len(FAULTS) == 6 and all(fault in text for fault in FAULTS)


def test_version():
    result = CliRunner().invoke(cli.app, ["--version"])
    assert result.exit_code == 0 and re.fullmatch(r"sprite \d+\.\d+\.\d+\S*\n", result.output)


def test_shell_completion(sprite_cmd):
    env = {**os.environ, "_SPRITE_COMPLETE": "complete_bash", "COMP_WORDS": "sprite par", "COMP_CWORD": "1"}
    done = subprocess.run(sprite_cmd, env=env, capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["parity"], done.stdout + done.stderr
    # typer finds the shell among the command's parent processes: run it from bash (not exec'd: "; exit"), so the
    # test does not depend on how pytest itself was started
    line = " ".join(shlex.quote(part) for part in [*sprite_cmd, "--show-completion", "bash"]) + "; exit $?"
    script = subprocess.run(["bash", "-c", line], capture_output=True, text=True, timeout=60)
    assert script.returncode == 0 and "_SPRITE_COMPLETE=complete_bash" in script.stdout
