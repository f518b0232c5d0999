"""What a person watching a checkpoint check sees: each launch's state and elapsed time, and what is left.

On a terminal, a rich progress display: one row per launch (waiting, running, done, failed, timed out,
skipped) with its elapsed time, and a total row with an estimate of the time left: the wall time so far per
process of the launches finished, times the processes still to launch. Elsewhere (a batch job's log) one line
per start and end, the estimate included.
"""

from __future__ import annotations

import time

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from sprite.parity.ckpt_roles import Launch

COLOURS = {"done": "green", "running": "cyan", "waiting": "dim", "skipped": "yellow"}


class Display:
    """Tracks the launches of one check; use as a context manager around the run."""

    def __init__(self, launches: list[Launch], console: Console, limit_s: float):
        self.console, self.live = console, console.is_terminal
        self.progress = Progress(TextColumn("{task.description:<24}"), TextColumn("{task.fields[state]}"),
                                 BarColumn(bar_width=20), TimeElapsedColumn(),
                                 console=console, disable=not self.live)
        self.total = self.progress.add_task(f"all ({len(launches)} launches, limit {limit_s:g} s each)", state="",
                                            total=sum(launch.processes for launch in launches))
        self.tasks = {launch.key: self.progress.add_task(launch.key, state="waiting", total=1, start=False)
                      for launch in launches}
        self.weights = {launch.key: launch.processes for launch in launches}
        self.started: dict[str, float] = {}
        self.begin, self.finished = time.monotonic(), set()

    def __enter__(self) -> Display:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.__exit__(*exc)

    def _set(self, key: str, state: str) -> None:
        colour = COLOURS.get(state.split()[0], "red")
        self.progress.update(self.tasks[key], state=f"[{colour}]{state}[/{colour}]")

    def start(self, key: str, processes: int) -> None:
        self.started[key] = time.monotonic()
        self.progress.start_task(self.tasks[key])
        self._set(key, f"running ({processes} process{'es' if processes > 1 else ''})")
        if not self.live:
            self.console.print(f"{key}: started, {processes} process(es)")

    def end(self, key: str, state: str) -> None:
        """Marks ``key`` ended in ``state`` (done, failed ..., timed out ..., skipped ...)."""
        seconds = time.monotonic() - self.started.get(key, time.monotonic())
        self.finished.add(key)
        self._set(key, state)
        self.progress.update(self.tasks[key], completed=1)
        self.progress.stop_task(self.tasks[key])
        self.progress.advance(self.total, self.weights[key])
        left = self.left()
        self.progress.update(self.total, state=f"about {left:.0f} s left" if left else "finished")
        if not self.live:
            self.console.print(f"{key}: {state}" + (f" after {seconds:.1f} s" if key in self.started else "")
                               + (f"; about {left:.0f} s left" if left else ""))

    def left(self) -> float:
        """Seconds left, estimated from the wall time per process of the launches finished so far."""
        done = sum(self.weights[key] for key in self.finished)
        total = sum(self.weights.values())
        return (time.monotonic() - self.begin) / done * (total - done) if done else 0.0
