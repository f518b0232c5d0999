"""The one command shape of sprite's three harnesses (`sprite parity`, `sprite bench`, `sprite ckpt-check`), and
their one way to end on an error. Imports nothing heavy (no torch): `sprite --help` stays instant.

`sprite NAME [OPTIONS]` runs the harness (`sprite NAME` alone too, with every default); `sprite NAME run [OPTIONS]`
is the same command under a name; the harness's other commands (`compare`) sit beside it. Without ``--out`` the
results go to a new ``./sprite-checks/NAME-<n>`` (sprite.parity.outdir).
"""

from __future__ import annotations

import inspect
import sys
from typing import Callable, NoReturn, Sequence

import typer

from sprite.errors import SpriteError, UsageError, report


def fail(err: SpriteError) -> NoReturn:
    """Prints ``err`` as sprite's one line on stderr and ends the command with its exit code (raises typer.Exit)."""
    print(report(err), file=sys.stderr, flush=True)
    raise typer.Exit(err.exit_code)


def harness(name: str, run: Callable, summary: str, examples: Sequence[str]) -> typer.Typer:
    """A Typer group for `sprite NAME`: its own options run ``run`` (a Typer command function), ``run`` is also
    mounted as the command `run`; add the other commands with ``@app.command``. The help ends with ``examples``.

    Options given before a command name (`sprite NAME --out X compare DIR`) would be ignored, so they end the
    command with a UsageError instead.
    """
    text = summary + "\n\n\b\nExamples:\n" + "\n".join(f"  {line}" for line in examples)

    def run_unless_a_command_follows(ctx: typer.Context, **options):
        if ctx.invoked_subcommand is None:
            return run(**options)
        given = [param.opts[0] for param in ctx.command.params
                 if getattr(ctx.get_parameter_source(param.name), "name", "DEFAULT") != "DEFAULT"]
        if given:
            command = ctx.invoked_subcommand
            fail(UsageError(f"`sprite {name} {given[0]} ... {command}` gives options before the command {command}.",
                            f"Options before a command belong to `sprite {name}` itself, not to {command}.",
                            f"Give only {command}'s options, after its name (see `sprite {name} {command} --help`)."))
        return None

    # Typer reads the options from the signature: ``run``'s, after the context (typer vendors click in 0.29).
    signature = inspect.signature(run, eval_str=True)
    context = inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context)
    parameters = [context, *signature.parameters.values()]
    run_unless_a_command_follows.__signature__ = signature.replace(parameters=parameters)
    run_unless_a_command_follows.__annotations__ = {p.name: p.annotation for p in parameters}
    run_unless_a_command_follows.__doc__ = run.__doc__

    app = typer.Typer(name=name, invoke_without_command=True, no_args_is_help=False, add_completion=False,
                      rich_markup_mode=None, help=text)
    app.callback()(run_unless_a_command_follows)
    app.command("run", help=f"The same as `sprite {name} [OPTIONS]`. {(run.__doc__ or '').strip()}")(run)
    return app
