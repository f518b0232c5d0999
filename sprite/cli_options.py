"""Option types of the ``sprite`` command line: fixed choices as Enums (so ``--help`` lists the allowed values
and typer refuses others with sprite's one-line error), host lists, and ``--version``."""

from __future__ import annotations

import enum
from typing import List, Optional

import typer

from sprite import contract
from sprite import spec as spec_values


def choices(name: str, values: tuple[str, ...]) -> type[enum.Enum]:
    """A str Enum of fixed choices, so --help lists the allowed values and typer refuses the others."""
    return enum.Enum(name, {value: value for value in values}, type=str)


Accelerator = choices("Accelerator", contract.ACCELERATORS)
Strategy = choices("Strategy", contract.STRATEGIES)
Launcher = choices("Launcher", spec_values.LAUNCHERS)
MpiFlavour = choices("MpiFlavour", spec_values.MPI_FLAVOURS)
Precision = choices("Precision", spec_values.PRECISIONS)


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


def commas(values: Optional[List[str]]) -> Optional[list]:
    """Host lists split at commas outside brackets: "a,nid[001235,001237]" -> ["a", "nid[001235,001237]"]."""
    if not values:
        return None
    parts = []
    for text in values:
        depth, start = 0, 0
        for index, char in enumerate(text + ","):
            depth += {"[": 1, "]": -1}.get(char, 0)
            if char == "," and depth <= 0:
                parts.append(text[start:index])
                start, depth = index + 1, 0
    return [part for part in parts if part]
