"""Where a harness (`sprite parity`, `sprite bench`, `sprite ckpt-check`) puts its results, and the one way it
creates that folder. No typer and nothing heavy: the CLI, the runners and the bench's ranks (bench/store.py) all
import it."""

from __future__ import annotations

import os
import pathlib
from typing import Callable

from sprite.errors import UsageError, one_line
from sprite.integrity import IntegrityError

CHECKS_FOLDER = "sprite-checks"  # where a harness writes when --out is not given


def default_out(name: str) -> pathlib.Path:
    """``./sprite-checks/<name>-<n>``, n the first number for which nothing exists at that path (not even a dangling
    symlink). The harness then creates it the way it creates any --out: exclusively where it refuses a used folder,
    so a second check that picked the same name at the same moment fails instead of writing into the first."""
    number = 1
    while os.path.lexists(pathlib.Path(CHECKS_FOLDER) / f"{name}-{number}"):
        number += 1
    return pathlib.Path(CHECKS_FOLDER) / f"{name}-{number}"


def fresh_numbered(directory: pathlib.Path, stem: str, most: int = 9999) -> tuple[pathlib.Path | None, str]:
    """(``directory/<stem>-N``, made now, 0700, the first N free; "") or (None, why) where ``directory`` takes no
    new folder: ``sprite parity compare``'s reports beside a run's own, never over them."""
    from sprite.integrity import make_dir_new

    for number in range(1, most + 1):
        into = directory / f"{stem}-{number}"
        if os.path.lexists(into):
            continue
        try:
            make_dir_new(into, 0o700)
            return into, ""
        except IntegrityError:
            continue  # made meanwhile by another compare
        except OSError as err:
            return None, f"{directory} does not take a new folder: {err.strerror or err}"
    return None, f"{directory} holds {most:,} {stem} folders"


def make_out(make: Callable, out: pathlib.Path) -> None:
    """``make(out)``, a harness's creation of its --out folder, with a failure to create it (a file where a folder
    of the path should be, a name another check took at the same moment, a folder that cannot be written) turned
    into bad usage: one line, exit 2. Raises UsageError."""
    try:
        make(out)
    except (OSError, IntegrityError) as err:
        raise UsageError(f"--out {one_line(str(out), 300)} cannot be made ({getattr(err, 'strerror', None) or err}).",
                         "A part of the path is a file, another check took the name, or the folder above it is not "
                         "writable.", "Pass a fresh directory under a folder you can write to.") from None


def out_help(what: str, name: str) -> str:
    """The --out option's help: ``what`` it holds, and where it goes when not given."""
    return f"{what} Default: a new ./{CHECKS_FOLDER}/{name}-<n>."
