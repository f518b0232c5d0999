"""One command shape for the three harnesses (parity/command.py): `sprite NAME [OPTIONS]` runs it (`sprite NAME`
alone too: `sprite ckpt-check` is a headline command, run as typed by tests/test_ckpt_check.py), `sprite NAME run
[OPTIONS]` is the same command, `compare` sits beside it, `--help` shows examples, and without --out the results
go to a new ./sprite-checks/NAME-<n>. In-process and planning only: every case ends in bad usage before anything
is launched."""

from __future__ import annotations

from pathlib import Path

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
def test_help_shows_examples_and_both_commands(capsys, name):
    code, out, err = sprite(capsys, name, "--help")
    assert code == 0 and err == "", err
    assert f" {name} [OPTIONS] COMMAND [ARGS]...\n" in out and "--out" in out
    assert f"\n    sprite {name} --" in out and f"\n    sprite {name} compare " in out  # examples, as typed
    assert f"./sprite-checks/{name}-<n>" in " ".join(out.split())  # where results go without --out
    commands = out[out.index("Commands:"):].split()
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
def test_without_out_bad_usage_still_makes_nothing(capsys, tmp_path, monkeypatch, name):
    monkeypatch.chdir(tmp_path)
    options, message = HARNESSES[name]
    code, _, err = sprite(capsys, name, *options)
    assert code == 2 and err.startswith(f"sprite: error: {message}") and err.count("\n") == 1, err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", HARNESSES)
def test_a_file_where_the_default_folder_goes_is_bad_usage_and_stays(capsys, tmp_path, monkeypatch, name):
    """Before, ckpt-check and bench ended such a case with exit 1 (a failed check) instead of 2."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sprite-checks").write_text("a user's file")
    code, _, err = sprite(capsys, name, "--accelerator", "cpu")
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"sprite: error: --out sprite-checks/{name}-1 cannot be made ("), err
    assert (tmp_path / "sprite-checks").read_text() == "a user's file" and len(list(tmp_path.iterdir())) == 1


def test_the_default_out_is_a_new_name_and_never_an_existing_path(tmp_path, monkeypatch):
    from sprite.parity.outdir import default_out

    monkeypatch.chdir(tmp_path)
    assert default_out("parity") == Path("sprite-checks/parity-1") and list(tmp_path.iterdir()) == []
    (tmp_path / "sprite-checks").mkdir()
    (tmp_path / "sprite-checks" / "parity-1").mkdir()
    (tmp_path / "sprite-checks" / "parity-2").symlink_to(tmp_path / "nowhere")  # dangling: still taken
    (tmp_path / "sprite-checks" / "parity-3").write_text("a user's file")
    assert default_out("parity") == Path("sprite-checks/parity-4")
    assert default_out("bench") == Path("sprite-checks/bench-1")
    assert sorted(p.name for p in (tmp_path / "sprite-checks").iterdir()) == ["parity-1", "parity-2", "parity-3"]


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


def test_bare_sprite_parity_runs_the_fp32_check_with_every_default(capsys, tmp_path, monkeypatch):
    """docs/parity.md: `sprite parity` alone runs the FP32 check with every default (2 devices, 1 node, tiny, auto,
    a 1800 s limit per arm, no faults) into a new ./sprite-checks/parity-N; stopped here once its settings are
    known (a FAKE claim_dir records them and refuses)."""
    from sprite.errors import UsageError
    from sprite.parity.check import runner
    from sprite.parity.settings import Settings

    seen = []

    def claim_dir(out, settings):
        seen.append((out, settings))
        raise UsageError("stopped by the test.", "", "")

    monkeypatch.setattr(runner, "claim_dir", claim_dir)
    monkeypatch.chdir(tmp_path)
    code, _, err = sprite(capsys, "parity")
    assert code == 2 and "stopped by the test" in err
    (out, settings), = seen
    assert out == Path("sprite-checks/parity-1")
    assert settings == Settings(precision="32-true", devices=2, nodes=1, model="tiny", accelerator="auto",
                                faults=(), time_limit=1800) == Settings()


def test_json_prints_the_verdict_reports_and_plot_on_stdout_and_the_progress_on_stderr(capsys, tmp_path, monkeypatch):
    """docs/parity.md: --json prints {"verdict", "reports", "plot"} on stdout, progress on stderr (FAKE arms and
    comparison: what --json does with their results is under test)."""
    import json

    from sprite.parity.check import compare, plot, runner

    monkeypatch.setattr(runner, "claim_dir", lambda out, settings: None)
    monkeypatch.setattr(runner, "run_arms", lambda out, settings, console, fresh=False: {})
    monkeypatch.setattr(compare, "compare", lambda out: {"fp32_report.json": {"verdict": "pass"}})
    monkeypatch.setattr(plot, "write_png", lambda out, reports: None)
    code, out, err = sprite(capsys, "parity", "--json", "--out", str(tmp_path / "x"))
    assert code == 0 and json.loads(out) == {"verdict": "pass", "reports": {"fp32_report.json": {"verdict": "pass"}},
                                             "plot": None}
    assert f"results: {tmp_path / 'x'}" in err and "comparing" in err


@pytest.mark.parametrize("name", HARNESSES)
def test_a_model_folder_the_arms_cannot_build_and_a_torch_build_without_the_device_are_refused_first(
        capsys, tmp_path, monkeypatch, name):
    """A config.json that is not JSON or names no model_type, and --accelerator cuda where this Python's torch is a
    CPU build (a FAKE build answer, so the test means the same on a GPU machine), used to fail every arm after the
    run began (exit 1): each is one line, exit 2, before --out is made."""
    from sprite.launch import devicecount

    model = tmp_path / "model"
    model.mkdir()
    out = str(tmp_path / "out")
    for body, said in (("{}", "config.json names no model_type."), ("[1", "cannot be read as JSON"),
                       ("[1]", "config.json names no model_type."), ("[" * 200_000, "(RecursionError)"),
                       (" " * 10_000_001, "(ValueError)")):
        (model / "config.json").write_text(body)
        code, _, err = sprite(capsys, name, "--out", out, "--model", str(model))
        assert code == 2 and said in err and err.count("\n") == 1, err
    monkeypatch.setattr(devicecount, "torch_build", lambda: "cpu")
    code, _, err = sprite(capsys, name, "--out", out, "--accelerator", "cuda")
    assert code == 2 and err.count("\n") == 1, err
    assert "--accelerator cuda cannot run here: this Python's torch is a cpu build" in err
    assert "pass --accelerator cpu." in err
    monkeypatch.setattr(devicecount, "torch_build", lambda: "cuda")  # the same build: no refusal from this check
    code, _, err = sprite(capsys, name, "--out", out, "--accelerator", "cuda", *HARNESSES[name][0])
    assert code == 2 and err.startswith(f"sprite: error: {HARNESSES[name][1]}"), err
    assert not (tmp_path / "out").exists()
