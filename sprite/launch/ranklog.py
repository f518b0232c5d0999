"""The console follower for launchers that write one file per rank themselves (srun ``--output``, Hydra
``-outfile-pattern``): they send the ranks' output to the files instead of the console, so this prints the
console ranks' files as they grow, as torchrun's agent tails its workers' log files.

    python -m sprite.launch.ranklog --dir DIR --ranks 0 --size 24 -- srun --label --output=DIR/rank%t.log ...

It starts the launcher as its child, forwards SIGINT, SIGTERM, SIGHUP, SIGUSR1 and SIGUSR2 to it (a PBS
preemption timer signals the process that `sprite run` became), and exits with the launcher's exit code.
``prepare(DIR)`` runs before any rank starts (in `sprite run` and here): make DIR, refuse one that holds rank logs.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time
from pathlib import Path

from sprite.integrity import owner_only
from sprite.contract import console as console_grammar
from sprite.errors import UsageError, one_line
from sprite.launch import folders

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
POLL_SECONDS = 0.2


def check(log_dir: str, label: str = "--log-dir") -> None:
    """Refuse ``log_dir`` before anything is made: a folder that cannot be made or written, or one that already
    holds rank logs (never appended to). ``label`` names where it was given (the flag, or ``file:line: key``).

    Raises UsageError.
    """
    path = Path(log_dir)
    why = folders.problem(log_dir)
    if why:
        raise UsageError(f"{label}: the rank-log folder {one_line(log_dir, 300)} {why}.",
                         "Every rank writes its rank<N>.log there.", "Choose a folder you can create and write.")
    old = sorted(p.name for p in path.glob("rank*.log")) if path.is_dir() else []
    if old:
        raise UsageError(f"{label}: {one_line(log_dir, 300)} already holds rank logs of an earlier run "
                         f"({', '.join(old[:3])}{', ...' if len(old) > 3 else ''}).",
                         "Rank logs are never appended to or replaced.", "Choose a fresh folder, or move the old "
                         "logs away.")


def prepare(log_dir: str, label: str = "--log-dir") -> None:
    """Check ``log_dir`` (``check``) and create it. Raises UsageError, also when it cannot be made meanwhile."""
    check(log_dir, label)
    try:
        owner_only.make_dirs(Path(log_dir))  # 0700, like every folder sprite creates (rank output may hold secrets)
    except OSError as err:
        raise UsageError(f"{label}: the rank-log folder {one_line(log_dir, 300)} cannot be made ({err.strerror}).",
                         "Its parent changed meanwhile, or the file system refuses it.",
                         "Choose a folder you can create and write.") from None


class Follower:
    """Prints the complete new lines of each followed file; ``flush()`` also prints a last unfinished line."""

    def __init__(self, paths: list[Path], sink=None):
        self.paths, self.sink = paths, sink or sys.stdout.buffer
        self.offsets = {path: 0 for path in paths}
        self.partial = {path: b"" for path in paths}

    def poll(self, final: bool = False) -> None:
        for path in self.paths:
            try:
                with open(path, "rb") as handle:
                    handle.seek(self.offsets[path])
                    data = handle.read()
            except OSError:
                continue  # not written yet
            self.offsets[path] += len(data)
            lines = (self.partial[path] + data).split(b"\n")
            rest = lines.pop()
            if final and rest:
                lines, rest = [*lines, rest], b""
            self.partial[path] = rest
            if lines:
                self.sink.write(b"".join(line + b"\n" for line in lines))
                self.sink.flush()


def follow(cmd: list[str], paths: list[Path]) -> int:
    """Run ``cmd`` to its end while printing ``paths`` as they grow; return its exit code."""
    from sprite.launch.procgroup import die_with_parent

    proc = subprocess.Popen(cmd, start_new_session=True, preexec_fn=die_with_parent)
    for sig in FORWARDED:
        signal.signal(sig, lambda signum, frame: proc.poll() is None and proc.send_signal(signum))
    follower = Follower(paths)
    while proc.poll() is None:
        follower.poll()
        time.sleep(POLL_SECONDS)
    follower.poll(final=True)
    return proc.returncode if proc.returncode >= 0 else 128 - proc.returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sprite.launch.ranklog", description=__doc__.splitlines()[0])
    parser.add_argument("--dir", required=True, help="the folder of rank<N>.log files")
    parser.add_argument("--ranks", required=True, help="ranks to print: 0, all or a list such as 0,3-5")
    parser.add_argument("--size", type=int, required=True, help="ranks in the world")
    parser.add_argument("cmd", nargs=argparse.REMAINDER, help="-- then the launcher command")
    args = parser.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        parser.error("need the launcher command after --")
    shown = console_grammar.members(args.ranks, args.size)
    try:
        prepare(args.dir)  # the launcher writes into it (Hydra and srun need it to exist); a relaunch's is new
    except UsageError as err:
        parser.error(str(err))
    return follow(cmd, [Path(args.dir) / f"rank{rank}.log" for rank in shown])


if __name__ == "__main__":
    sys.exit(main())
