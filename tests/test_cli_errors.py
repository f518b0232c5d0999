"""Every bad input reaches the user as one line on stderr and exit code 2, never a traceback."""

from __future__ import annotations

import json
import subprocess

import pytest


def run_sprite(sprite_cmd, args, env, cwd=None):
    return subprocess.run([*sprite_cmd, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=60)


def assert_one_line_usage_error(result, *fragments):
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1 and lines[0].startswith("sprite: error: "), result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
    for fragment in fragments:
        assert fragment in lines[0]


@pytest.fixture
def spec_file(tmp_path, example_script):
    def write(body: str):
        path = tmp_path / "job.yaml"
        path.write_text(body.replace("SCRIPT", example_script))
        return str(path)
    return write


def test_missing_script(sprite_cmd, clean_env, tmp_path):
    result = run_sprite(sprite_cmd, ["run", "--dry-run", str(tmp_path / "nope.py")], clean_env)
    assert_one_line_usage_error(result, "nope.py does not exist")


def test_a_folder_given_as_the_script_is_named_a_folder(sprite_cmd, clean_env, tmp_path):
    result = run_sprite(sprite_cmd, ["run", "--dry-run", str(tmp_path)], clean_env)
    assert_one_line_usage_error(result, "is a folder, not a file")


def test_a_path_no_command_checked_is_one_line_not_a_traceback(sprite_cmd, clean_env, tmp_path):
    """The command line's last net (cli/app.main): an OSError on a path is bad input (exit 2) in one line; any
    other OSError (a full disk) is a failure (exit 1)."""
    import errno

    from sprite.errors import EXIT_CHECK_FAILED, EXIT_USAGE, from_os_error

    result = run_sprite(sprite_cmd, ["preflight", "--devices", "1", "--out", "/proc/sprite-no/x"], clean_env)
    assert_one_line_usage_error(result, "No such file or directory: '/proc/sprite-no'", "Check the path")
    denied = from_os_error(PermissionError(errno.EACCES, "Permission denied", "/locked"))
    assert denied.exit_code == EXIT_USAGE and str(denied).startswith("Permission denied: '/locked'.")
    full = from_os_error(OSError(errno.ENOSPC, "No space left on device", "/full/x"))
    assert full.exit_code == EXIT_CHECK_FAILED and "Free space" in str(full)


def test_resuming_a_checkpoint_sprite_did_not_seal_is_refused_before_any_rank_starts(sprite_cmd, clean_env,
                                                                                      tmp_path, example_script):
    """The ranks refuse a checkpoint without a manifest (its pickle is never loaded): refused at once instead, in
    one line, exit 2, before Lightning starts on every rank."""
    foreign = tmp_path / "model.ckpt"
    foreign.write_bytes(b"not sprite's")
    result = run_sprite(sprite_cmd, ["run", "--dry-run", "--resume", str(foreign), example_script], clean_env)
    assert_one_line_usage_error(result, f"--resume {foreign}: the checkpoint has no sprite manifest",
                                "--resume auto")


def test_nodes_two_in_spec_names_file_line_and_key(sprite_cmd, clean_env, spec_file):
    path = spec_file("script: SCRIPT\ndevices: 2\nnodes: two\n")
    result = run_sprite(sprite_cmd, ["run", "--dry-run", "--spec", path], clean_env)
    assert_one_line_usage_error(result, f"{path}:3", "'nodes'", "'two' is not a whole number")


def test_unknown_key_in_spec(sprite_cmd, clean_env, spec_file):
    path = spec_file("script: SCRIPT\nnode: 2\n")
    result = run_sprite(sprite_cmd, ["run", "--dry-run", "--spec", path], clean_env)
    assert_one_line_usage_error(result, f"{path}:2", "'node'", "is not a job spec key", "Allowed: script, args")


def test_invalid_yaml_names_line(sprite_cmd, clean_env, spec_file):
    path = spec_file("script: SCRIPT\nenv: [unclosed\n")
    result = run_sprite(sprite_cmd, ["run", "--dry-run", "--spec", path], clean_env)
    assert_one_line_usage_error(result, path, "not valid YAML")


def test_nodes_beyond_allocation(sprite_cmd, clean_env, tmp_path, example_script):
    nodefile = tmp_path / "nodes"
    nodefile.write_text("h1\nh2\n")
    env = {**clean_env, "PBS_JOBID": "77.pbs", "PBS_NODEFILE": str(nodefile)}
    result = run_sprite(sprite_cmd, ["run", "--site", "aurora", "--nodes", "3", "--dry-run", example_script], env)
    assert_one_line_usage_error(result, "--nodes 3", "(2: h1, h2)", "Use --nodes 2 or fewer")


@pytest.mark.parametrize("args, fragment", [
    (["--json"], "--json only changes what --dry-run prints"),
    (["--dry-run", "--strategy", "single", "--devices", "2"], "--strategy single runs one rank"),
    (["--dry-run", "--launcher", "srun"], "needs a Slurm allocation"),
    (["--dry-run", "--nodes", "two"], "Option --nodes: 'two' is not a whole number"),
    (["--dry-run", "--nodes", "0"], "Option --nodes: '0' is outside 1..200000"),
    (["--dry-run", "--devices", "010"], "Option --devices: '010' has a leading zero"),
    (["--dry-run", "--precision", "fp8"], "Invalid value for '--precision'"),
    (["--dry-run", "--strategy", "zero3"], "Invalid value for '--strategy'"),
    (["--dry-run", "--ranks", "0-"], "Option --ranks: '0-' is not a set of ranks"),
    (["--dry-run", "--ranks", "5-2"], "runs backwards"),
    (["--dry-run", "--cpu-bind", "a b"], "Option --cpu-bind: 'a b' cannot be written safely"),
    (["--dry-run", "--site", "frontier"], "Unknown site 'frontier'"),
    (["--dry-run", "--env", "=VALUE"], "has a value but no NAME"),
    (["--dry-run", "--exclude", "h1"], "--exclude h1 needs a PBS or Slurm allocation"),
    (["--dry-run", "--master-port", "80"], "outside the unprivileged port range"),
])
def test_bad_flags_and_conflicts(sprite_cmd, clean_env, example_script, args, fragment):
    result = run_sprite(sprite_cmd, ["run", *args, example_script], clean_env)
    assert_one_line_usage_error(result, fragment)


def test_missing_launcher_program(sprite_cmd, clean_env, example_script, tmp_path):
    env = {**clean_env, "PATH": str(tmp_path)}  # no srun anywhere
    env.update({"SLURM_JOB_ID": "5", "SLURM_JOB_NODELIST": "n1"})
    result = run_sprite(sprite_cmd, ["run", "--site", "perlmutter", example_script], env)
    assert_one_line_usage_error(result, "'srun' is not on PATH")


def test_arguments_after_script_belong_to_the_script(sprite_cmd, clean_env, example_script):
    result = run_sprite(sprite_cmd, ["run", "--dry-run", "--json", example_script, "--dry-run", "--nodes", "9"],
                        clean_env)
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)
    assert plan["argv"][-4:] == [example_script, "--dry-run", "--nodes", "9"]
    assert plan["env"]["SPRITE_NUM_NODES"] == "1"  # the script's --nodes is not sprite's


@pytest.mark.parametrize("command, example", [
    ("run", "sprite run --devices 2 examples/train.py"), ("env", "sprite env --json"),
    ("qsub", "sprite qsub --dry-run aurora.job.yaml"), ("sbatch", "sprite sbatch --dry-run perlmutter.job.yaml"),
    ("status", "sprite status 1234"), ("cancel", "sprite cancel 1234"),
])
def test_help_shows_an_example(sprite_cmd, clean_env, command, example):
    result = run_sprite(sprite_cmd, [command, "--help"], clean_env)
    assert result.returncode == 0 and example in result.stdout


@pytest.mark.parametrize("args, fragment", [
    (["qsub"], "Missing argument 'spec'. See 'sprite qsub --help'"),
    (["nosuch"], "No such command 'nosuch'"),
    (["env", "--bogus"], "No such option: --bogus."),
    (["run", "--nodes"], "'--nodes' requires an argument. See 'sprite run --help'"),
    (["run", "--bogus", "train.py"], "sprite run has no option --bogus."),
])
def test_parsing_errors_are_one_line(sprite_cmd, clean_env, args, fragment):
    result = run_sprite(sprite_cmd, args, clean_env)
    assert_one_line_usage_error(result, fragment)


@pytest.mark.parametrize("args, says", [
    ([], "Usage: sprite [OPTIONS] COMMAND"), (["run"], "Usage: sprite run [OPTIONS]"),
    (["ckpt"], "Usage: sprite ckpt [OPTIONS] COMMAND"), (["sbatch"], "Missing argument 'spec'"),
    (["status"], "Missing argument 'job_id'"), (["cancel"], "Missing argument 'job_id'"),
    (["runs"], "sprite-runs is not a folder"), (["env"], ""),
])
def test_a_command_given_no_arguments_prints_its_help_names_what_it_misses_or_takes_its_defaults(
        sprite_cmd, clean_env, tmp_path, args, says):
    """docs/run.md: what each command does with no arguments (the checks' defaults: test_ckpt_check.py and the
    parity and bench suites)."""
    result = run_sprite(sprite_cmd, args, clean_env, cwd=tmp_path)
    if says.startswith("Usage:"):
        assert result.returncode == 2 and (result.stdout + result.stderr).startswith(says), result.stderr
    elif says:
        assert_one_line_usage_error(result, says)
    else:
        assert result.returncode == 0 and result.stdout.strip(), result.stderr


def test_site_profile_job_block_that_is_not_a_mapping(sprite_cmd, clean_env, tmp_path, example_script):
    profile = tmp_path / "mine.yaml"
    profile.write_text("name: mine\njob: [1, 2]\n")
    result = run_sprite(sprite_cmd, ["run", "--dry-run", "--site", str(profile), example_script], clean_env)
    assert_one_line_usage_error(result, f"{profile}:2", "'job'", "is a list, not a mapping")


def test_every_commands_help_has_an_example_whose_options_it_takes():
    """Every command and subcommand's --help shows an example, and each --option the example uses is one of that
    command's own (an example naming a renamed or missing option would fail at once for whoever copies it)."""
    import re

    import typer
    from typer.testing import CliRunner

    from sprite.cli.app import app

    def walk(command, path):
        yield path, command
        for name, sub in getattr(command, "commands", {}).items():
            yield from walk(sub, [*path, name])

    checked = []
    for path, command in walk(typer.main.get_command(app), []):
        shown = CliRunner().invoke(app, [*path, "--help"]).output
        examples = [line.strip() for line in shown.splitlines() if re.match(r"\s*(Example: )?sprite ", line)]
        assert examples and re.search(r"Examples?:", shown), (path, shown)
        taken = {opt for param in command.params
                 for opt in [*getattr(param, "opts", []), *getattr(param, "secondary_opts", [])]}
        for example in examples:
            words = example.split("#")[0].replace("Example: ", "").split()
            rest = words[1 + len(path):]
            if words[1:1 + len(path)] != path or (rest and rest[0] in getattr(command, "commands", {})):
                continue  # an example of another command (a group's, of its subcommand)
            script = next((i for i, w in enumerate(rest) if w.endswith(".py")), len(rest))  # then the script's own
            unknown = [w.split("=")[0] for w in rest[:script] if w.startswith("--") and w.split("=")[0] not in taken]
            assert not unknown, (path, example, unknown)
            checked.append(example)
    assert len(checked) >= 15, checked


def test_an_unreadable_spec_and_an_empty_checkpoint_path_say_what_is_wrong(sprite_cmd, clean_env, tmp_path,
                                                                          monkeypatch):
    """An unreadable spec was blamed on a wrong path; `sprite ckpt verify ""` said " does not exist"."""
    import errno
    import os

    from sprite.errors import UsageError
    from sprite.spec import yamldoc

    spec = tmp_path / "job.yaml"
    spec.write_text("script: t.py\n")
    monkeypatch.setattr(os, "open", lambda *a, **k: (_ for _ in ()).throw(PermissionError(errno.EACCES,
                                                                                           "Permission denied")))
    with pytest.raises(UsageError, match="Permission denied. This user may not read the file. Fix its permissions"):
        yamldoc.load(str(spec))
    monkeypatch.undo()
    result = run_sprite(sprite_cmd, ["ckpt", "verify", ""], clean_env)
    assert_one_line_usage_error(result, "sprite ckpt verify was given an empty path")


def test_sprite_env_names_a_bad_sprite_site_variable(sprite_cmd, clean_env):
    result = run_sprite(sprite_cmd, ["env"], {**clean_env, "SPRITE_SITE": "bogus"})
    assert_one_line_usage_error(result, "SPRITE_SITE=bogus: Unknown site 'bogus'")


def test_sprite_env_refuses_an_empty_site_rather_than_reporting_local(sprite_cmd, clean_env):
    """--site "$SITE" with SITE unset: sprite run refuses it, and sprite env reported the local site."""
    result = run_sprite(sprite_cmd, ["env", "--site", ""], clean_env)
    assert_one_line_usage_error(result, "Option --site: '' is not a non-empty string.")
    slurm = {**clean_env, "SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "nid[001-002]"}
    result = run_sprite(sprite_cmd, ["env", "--site", "aurora"], slurm)  # refused as sprite run refuses it
    assert_one_line_usage_error(result, "The site profile aurora is for PBS jobs, and this is a SLURM allocation")


def test_an_empty_run_dir_is_refused_not_taken_for_the_default(sprite_cmd, clean_env, example_script):
    result = run_sprite(sprite_cmd, ["run", "--dry-run", "--run-dir", "", example_script], clean_env)
    assert_one_line_usage_error(result, "--run-dir was given an empty path")
