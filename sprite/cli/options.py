"""Option types of the ``sprite`` command line: fixed choices as Enums (so ``--help`` lists the allowed values
and typer refuses others with sprite's one-line error), numbers shown as INTEGER / FLOAT, and ``--version``."""

from __future__ import annotations

import enum
from typing import Optional

import typer

from sprite import contract
from sprite.spec import job as spec_values


def choices(name: str, values: tuple[str, ...]) -> type[enum.Enum]:
    """A str Enum of fixed choices, so --help lists the allowed values and typer refuses the others."""
    return enum.Enum(name, {value: value for value in values}, type=str)


Accelerator = choices("Accelerator", contract.ACCELERATORS)
Strategy = choices("Strategy", contract.STRATEGIES)
Launcher = choices("Launcher", spec_values.LAUNCHERS)
MpiFlavour = choices("MpiFlavour", spec_values.MPI_FLAVOURS)
Precision = choices("Precision", spec_values.PRECISIONS)


# Number options are typed as text with these metavars: --help shows INTEGER / FLOAT, and the key's checker in
# sprite.values.grammar reads the text once (click's own int() would take "010", " 7" and "1_000" without a word).
WHOLE = "INTEGER"
SECONDS = "FLOAT"


def version(given: bool) -> None:
    """``--version``: print the installed distribution's version and exit 0 (raises typer.Exit)."""
    if given:
        from importlib.metadata import PackageNotFoundError
        from importlib.metadata import version as installed

        try:
            typer.echo(f"sprite {installed('sprite-hpc')}")
        except PackageNotFoundError:  # a source tree that was never installed
            from sprite import __version__

            typer.echo(f"sprite {__version__}")
        raise typer.Exit(0)


def value(choice: Optional[enum.Enum]) -> Optional[str]:
    """The plain string of a choice (None when the option was not given)."""
    return choice.value if choice is not None else None
