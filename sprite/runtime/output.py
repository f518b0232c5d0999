"""A rank's own output split, for launchers that cannot do it themselves (PALS, Open MPI, torchrun; and the
console filter under every launcher but sprite's supervisor). The plan asks for it in two variables:

- ``SPRITE_LOG_DIR``: this rank writes everything it prints to ``DIR/rank<N>.log``, a new file (0600);
- ``SPRITE_CONSOLE_RANKS``: only these ranks print to the launcher's console; the others print only to their
  log file (or nowhere without one), and a rank that fails still says so on the console, in one line.

The split is done at the file-descriptor level, so output of C extensions and child processes is caught too.
A console rank with a log file tees through coreutils ``tee`` children, one per stream, which drain their pipe
even when the rank dies abruptly; at a normal exit the rank waits for them.
"""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
from pathlib import Path
from typing import Mapping

from sprite import contract
from sprite.errors import UsageError
from sprite.integrity import owner_only
from sprite.contract import console as console_grammar
from sprite.runtime.ranks import FLAVOURS, read_rank_var, detect_flavour


class Output:
    """Where this rank's output went; ``failed(text)`` tells the console when a hidden rank fails."""

    def __init__(self, rank: int, console: bool, log: str | None, console_fd: int | None):
        self.rank, self.console, self.log, self.console_fd = rank, console, log, console_fd

    def failed(self, text: str) -> None:
        if self.console or self.console_fd is None:
            return  # the console already shows this rank's own error
        where = f" (its output: {self.log})" if self.log else " (rerun with --ranks all or --log-dir DIR to see it)"
        os.write(self.console_fd, f"sprite: rank {self.rank} failed: {text}{where}\n".encode(errors="replace"))


def _tee(stream_fd: int, log_fd: int) -> subprocess.Popen:
    read, write = os.pipe()
    tee = subprocess.Popen(["tee", "-a", f"/dev/fd/{log_fd}"], stdin=read, stdout=stream_fd, pass_fds=(log_fd,))
    os.close(read)
    os.dup2(write, stream_fd)
    os.close(write)
    return tee


def _drain(tees: list[subprocess.Popen]) -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    for fd in (1, 2):
        os.close(fd)  # the tees see the end of their pipe
    for tee in tees:
        try:
            tee.wait(timeout=10)
        except subprocess.TimeoutExpired:
            tee.kill()


def whole_lines() -> None:
    """Write stdout and stderr a whole line at a time, also under PYTHONUNBUFFERED.

    Workaround: MPICH Hydra's -prepend-rank labels every chunk it reads, so print()'s text and newline sent
    as two writes came out as "[0] x[0] " + newline (MPICH 5.0.2 here, 2026-11-29); one write per line
    keeps every label at a line start, under any launcher that labels.
    """
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(line_buffering=True, write_through=False)
        except (AttributeError, ValueError):
            pass  # replaced by the script's caller with a stream that cannot be reconfigured


def install(environ: Mapping[str, str] = os.environ) -> Output | None:
    """Redirect this process's stdout and stderr as the plan asked; None when it asked nothing.

    Raises UsageError when the rank cannot be read, FileExistsError when the rank's log file already exists.
    """
    log_dir, spec = environ.get(contract.LOG_DIR), environ.get(contract.CONSOLE_RANKS)
    if not log_dir and not spec:
        return None
    flavour = detect_flavour(environ) or "local"
    names = FLAVOURS.get(flavour, FLAVOURS["local"])
    rank = read_rank_var(environ, names.rank, "rank", flavour)
    size = read_rank_var(environ, names.world_size, "world size", flavour)
    try:
        console = not spec or rank in console_grammar.members(spec, size)
    except ValueError as err:
        raise UsageError(f"{contract.CONSOLE_RANKS}={spec[:80]!r} cannot be read ({err}).", "sprite run sets it "
                         "from --ranks; a hand-set one may be wrong.", "Unset it, or pass --ranks to sprite run.")
    log = str(Path(log_dir) / f"rank{rank}.log") if log_dir else None
    if log_dir:
        owner_only.make_dirs(log_dir)  # a relaunch's DIR/attempt<N> is made by its ranks (0700)
    # A new file, 0600 as every log sprite creates (sprite.integrity.owner_only), never through a symlink.
    log_fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_NOFOLLOW, 0o600) if log else None
    console_fd = None if console else os.dup(2)
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    if console and log_fd is not None:
        tees = [_tee(fd, log_fd) for fd in (1, 2)]
        atexit.register(_drain, tees)
    elif not console:
        target = log_fd if log_fd is not None else os.open(os.devnull, os.O_WRONLY)
        for fd in (1, 2):
            os.dup2(target, fd)
        if log_fd is None:
            os.close(target)
    if log_fd is not None:
        os.close(log_fd)
    return Output(rank, console, log, console_fd)
