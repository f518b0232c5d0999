"""One command shape for the three harnesses (parity/command.py): `sprite NAME [OPTIONS]` runs it, `sprite NAME run
[OPTIONS]` is the same command, `compare` sits beside it, `sprite NAME` alone prints the help with examples.
In-process and planning only: every case ends in bad usage before anything is launched."""

from __future__ import annotations

import pytest

from sprite.cli import app as cli

# A harness and options that fail its own validation (not typer's), after --out is taken.
HARNESSES = {
    "parity": (["--devices", "1"], "--devices 1 --nodes 1 gives 1 rank(s)."),
    "bench": (["--sweep", "1,x"], "--sweep '1,x' is not a list of distinct world sizes."),
    "ckpt-check": (["--devices", "1"], "--devices 1 --nodes 1 gives 1 rank(s)."),
}


def sprite(capsys, *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_info:
        cli.main(list(args))
    captured = capsys.readouterr()
    return exit_info.value.code, captured.out, captured.err


@pytest.mark.parametrize("name", HARNESSES)
def test_alone_it_prints_its_help_with_examples_and_both_commands(capsys, name):
    code, out, err = sprite(capsys, name)
    assert code == 2 and out == "", out
    assert f" {name} [OPTIONS] COMMAND [ARGS]...\n" in err and "--out" in err
    assert f"\n    sprite {name} --" in err and f"\n    sprite {name} compare " in err  # examples, as typed
    commands = err[err.index("Commands:"):].split()
    assert "run" in commands and "compare" in commands


@pytest.mark.parametrize("name", HARNESSES)
def test_options_run_it_and_run_is_the_same_command(capsys, tmp_path, name):
    options, message = HARNESSES[name]
    lines = []
    for prefix in ([name], [name, "run"]):
        code, _, err = sprite(capsys, *prefix, "--out", str(tmp_path / "out"), *options)
        assert code == 2 and err.count("\n") == 1, err
        lines.append(err)
    assert lines[0] == lines[1] and lines[0].startswith(f"sprite: error: {message}")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", HARNESSES)
def test_out_is_required_to_run(capsys, name):
    code, _, err = sprite(capsys, name, "--accelerator", "cpu")
    assert code == 2 and err.startswith("sprite: error: No --out ") and err.count("\n") == 1, err


@pytest.mark.parametrize("name", HARNESSES)
def test_options_before_a_command_are_refused(capsys, tmp_path, name):
    code, _, err = sprite(capsys, name, "--out", str(tmp_path / "x"), "compare", str(tmp_path / "x"))
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"sprite: error: `sprite {name} --out ... compare` gives options before the command compare.")
    assert f"see `sprite {name} compare --help`" in err


@pytest.mark.parametrize("name", HARNESSES)
def test_compare_stays_a_command(capsys, tmp_path, name):
    args = [str(tmp_path / "none")] * (2 if name == "bench" else 1)
    code, _, err = sprite(capsys, name, "compare", *args)
    assert code == 2 and err.count("\n") == 1 and str(tmp_path / "none") in err, err
