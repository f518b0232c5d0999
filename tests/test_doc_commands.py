"""Every `sprite ...` command line in README.md and docs/*.md parses with the real command tree.

A line counts when it sits in a fenced code block and starts with `sprite ` (after an optional `$ `); a trailing
backslash continues it, `# ...` is a comment, a shell operator (`|`, `&&`, `>`) ends it and `[--flag]` is read as
the flag it shows. The line is parsed, never run: the command and its subcommands are resolved and each gets
``make_context`` with resilient parsing off, so an unknown option, an unknown command, a missing argument or a
removed form fails. Placeholders such as RUN or DIR are ordinary positional values. Run records under docs/runs/
are history and are not read.
"""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest
import typer

from sprite.cli import app as cli

REPO = Path(__file__).resolve().parents[1]
SHELL_OPERATORS = {"|", "||", "&&", ";", "&", ">", ">>", "2>", "2>&1", "<"}


def command_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, command) for every `sprite ...` line inside a fenced code block of ``path``."""
    found, fenced, pending = [], False, None
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.lstrip().startswith(("```", "~~~")):
            fenced, pending = not fenced, None
            continue
        if not fenced:
            continue
        text = line.strip()
        if pending is not None:
            start, head = pending
            text, pending = head + " " + text, None
        else:
            start = number
            text = text[2:] if text.startswith("$ ") else text
            if not text.startswith("sprite "):
                continue
        if text.endswith("\\"):
            pending = (start, text[:-1].rstrip())
        else:
            found.append((start, text))
    return found


def words(line: str) -> list[str]:
    """The arguments after `sprite`: shell words up to a comment or a shell operator, `[--x]` read as `--x`."""
    tokens = shlex.split(line, comments=True)[1:]
    cut = next((i for i, token in enumerate(tokens) if token in SHELL_OPERATORS), len(tokens))
    return [re.sub(r"^\[(-.*)\]$", r"\1", token) for token in tokens[:cut]]


def parse(args: list[str]) -> list[str]:
    """Parses ``sprite ARGS`` as the CLI would, running nothing; returns the path of every command below `sprite`.

    Raises the CLI's own usage error (typer's click) for what the CLI would refuse before running a command,
    and ValueError for an unknown option swallowed by a command that passes unknown options on (`sprite run`).
    `--help` and `--version` end the parse as they end the command (their output is discarded).
    """
    command = typer.main.get_command(cli.app)
    name, parent, paths = "sprite", None, []
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            while True:
                paths.append(f"{parent.command_path} {name}" if parent else name)
                ctx = command.make_context(name, list(args), parent=parent, resilient_parsing=False)
                _refuse_swallowed_option(command, ctx)
                rest = [*getattr(ctx, "_protected_args", getattr(ctx, "protected_args", [])), *ctx.args]
                if not hasattr(command, "commands"):
                    return paths[1:]
                if not rest:
                    if not command.invoke_without_command:
                        ctx.fail("Missing command.")
                    return paths[1:]
                name, command, args = command.resolve_command(ctx, rest)
                parent = ctx
    except typer.Exit as done:  # --help, --version: the command would stop here, successfully
        if done.exit_code:
            raise
        return paths[1:]


def _refuse_swallowed_option(command, ctx) -> None:
    """`sprite run` passes unknown options on as SCRIPT; the command refuses them in its body, so does the parse."""
    if not (command.context_settings or {}).get("ignore_unknown_options"):
        return
    first = next((p for p in command.params if p.param_type_name == "argument"), None)
    value = ctx.params.get(first.name) if first else None
    if isinstance(value, str) and value.startswith("-"):
        raise ValueError(f"{ctx.command_path} has no option {value}")


DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINES = [(path, number, line) for path in DOCS for number, line in command_lines(path)]


def test_the_docs_hold_command_lines():
    assert len(LINES) >= 20 and {path.name for path, _, _ in LINES} >= {"README.md"}


@pytest.mark.parametrize("path, number, line", LINES, ids=[f"{p.name}:{n}" for p, n, _ in LINES])
def test_every_documented_command_line_parses(path, number, line):
    try:
        parse(words(line))
    except Exception as err:  # noqa: BLE001  (any refusal fails the line, with the CLI's own message)
        message = err.format_message() if hasattr(err, "format_message") else str(err)
        pytest.fail(f"{path.relative_to(REPO)}:{number}: {line}\n  -> {type(err).__name__}: {message}")


@pytest.mark.parametrize("line, reason", [
    ("sprite run --bogus-option train.py", "no option --bogus-option"),
    ("sprite run --devices 2 --no-such-flag train.py", "no option --no-such-flag"),
    ("sprite parity --precision bf16-mixed --bogus 1", "No such option"),
    ("sprite parity compare DIR --bogus", "No such option"),
    ("sprite bench --sweep 1,2 --nope --out DIR", "No such option"),
    ("sprite ckpt-check --bogus", "No such option"),
    ("sprite qsub --dry-run", "Missing argument"),
    ("sprite no-such-command", "No such command"),
    ("sprite parity frobnicate DIR", "No such command"),
    ("sprite sbatch job.yaml extra", "unexpected extra argument"),
])
def test_the_parse_refuses_what_the_cli_refuses(line, reason):
    with pytest.raises(Exception) as refused:
        parse(words(line))
    message = getattr(refused.value, "format_message", lambda: str(refused.value))()
    assert reason in message, message


@pytest.mark.parametrize("line, paths", [
    ("sprite parity --precision bf16-mixed --devices 2 --out runs/bf16", ["sprite parity"]),
    ("sprite parity run --precision 32-true --out DIR", ["sprite parity", "sprite parity run"]),
    ("sprite ckpt list DIR [--json]   # a comment", ["sprite ckpt", "sprite ckpt list"]),
    ("sprite run --nodes 2 --strategy fsdp train.py --max-steps 20 | tee log", ["sprite run"]),
    ("sprite bench compare OLD NEW --tolerance 0.05", ["sprite bench", "sprite bench compare"]),
    ("sprite qsub --help", ["sprite qsub"]),
])
def test_the_parse_accepts_what_the_cli_accepts(line, paths):
    assert parse(words(line)) == paths


def test_lines_are_taken_from_code_blocks_only_with_continuations(tmp_path):
    doc = tmp_path / "x.md"
    doc.write_text("sprite run outside.py\n```bash\n$ sprite run --devices 2 \\\n    train.py\necho sprite x\n"
                   "sprite env --json\n```\n`sprite not-code`\n")
    assert command_lines(doc) == [(3, "sprite run --devices 2 train.py"), (6, "sprite env --json")]
