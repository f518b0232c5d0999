"""A progress display for long checks made of items that run for minutes (parity arms, ckpt-check cases,
benchmark runs): each item's state and elapsed time, and an estimate of what is left.

On a terminal it is a live rich table; elsewhere (a log file, CI) one line per start and per end, so logs stay
readable. Thread-safe: items may start and finish in worker threads. Usage::

    with ProgressBoard(console, [("ref", processes(1)), ("ddp", processes(2))], "parity arms") as board:
        board.start("ref"); ...; board.finish("ref", ok=True)

The estimate: an item of a kind (the second field) is expected to take as long as the finished items of that
kind took on average (else all finished items); what is left is the sum of those expectations, less the time
the running items have already spent. Nothing is estimated before the first item finishes.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

STYLES = {"waiting": "dim", "running": "yellow", "done": "green", "failed": "red", "skipped": "magenta"}


@dataclass
class Item:
    name: str
    kind: str
    state: str = "waiting"
    started: float | None = None
    ended: float | None = None
    note: str = ""

    def elapsed(self, now: float) -> float:
        return 0.0 if self.started is None else (now if self.ended is None else self.ended) - self.started


def processes(count: int) -> str:
    """The kind of an item that launches ``count`` processes ("1 process", "2 processes"): parity, ckpt-check
    and bench estimate a launch from finished launches of the same size."""
    return f"{count} process{'es' if count > 1 else ''}"


def _clock(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    seconds = int(round(seconds))
    return f"{seconds // 60}:{seconds % 60:02d}" if seconds >= 60 else f"{seconds} s"


class ProgressBoard:
    """Item states for a console: a live table on a terminal, start/end lines elsewhere."""

    def __init__(self, console: Console, items: list[tuple[str, str]], title: str = "", clock=time.monotonic):
        self.console, self.title, self.clock = console, title, clock
        self.items = {name: Item(name, kind) for name, kind in items}
        self.lock = threading.Lock()
        self.began = clock()
        self.live = Live(self, console=console, refresh_per_second=2, transient=False) if console.is_terminal else None

    def __enter__(self) -> ProgressBoard:
        if self.live:
            self.live.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.live:
            self.live.stop()

    def start(self, name: str) -> None:
        with self.lock:
            item = self.items[name]
            item.state, item.started = "running", self.clock()
        if not self.live:
            self.console.print(f"[{self._index(name)}/{len(self.items)}] {name}: {item.kind} ...")

    def finish(self, name: str, ok: bool, note: str = "") -> None:
        with self.lock:
            item = self.items[name]
            item.state, item.ended, item.note = ("done" if ok else "failed"), self.clock(), note
            left = self.estimate_left()
        if not self.live:
            state = "done" if ok else f"[red]failed[/red]{', ' + note if note else ''}"
            self.console.print(f"[{self._index(name)}/{len(self.items)}] {name}: {state} in "
                               f"{item.elapsed(item.ended):.1f} s; about {_clock(left)} left")

    def skip(self, name: str, note: str) -> None:
        """Marks an item that will not run (its inputs failed, or the check ended first); it counts as finished
        but not in the estimate, since it took no time."""
        with self.lock:
            item = self.items[name]
            item.state, item.ended, item.note = "skipped", self.clock(), note
            item.started = item.started if item.started is not None else item.ended
        if not self.live:
            self.console.print(f"[{self._index(name)}/{len(self.items)}] {name}: [magenta]skipped[/magenta], {note}")

    def _index(self, name: str) -> int:
        return list(self.items).index(name) + 1

    def estimate_left(self, now: float | None = None) -> float | None:
        """Seconds the unfinished items should still take; None before any item has finished."""
        now = self.clock() if now is None else now
        finished = [i for i in self.items.values() if i.ended is not None and i.state != "skipped"]
        if not finished:
            return None
        overall = sum(i.elapsed(now) for i in finished) / len(finished)
        left = 0.0
        for item in self.items.values():
            if item.ended is None:  # a skipped item has ended
                same = [i.elapsed(now) for i in finished if i.kind == item.kind]
                expected = sum(same) / len(same) if same else overall
                left += max(0.0, expected - item.elapsed(now))
        return left

    def __rich__(self) -> Group:
        now = self.clock()
        with self.lock:
            done = sum(i.ended is not None for i in self.items.values())
            left = self.estimate_left(now)
            summary = (f"{done} of {len(self.items)} finished, {_clock(now - self.began)} elapsed, " +
                       (f"about {_clock(left)} left" if left is not None else "time left: known once one finishes"))
            table = Table(title=self.title or None, title_justify="left")
            for column in ("item", "what", "state", "elapsed"):
                table.add_column(column)
            for item in self.items.values():
                style = STYLES[item.state]
                state = item.state + (f" ({item.note})" if item.note else "")
                table.add_row(item.name, item.kind, f"[{style}]{state}[/{style}]",
                              _clock(item.elapsed(now)) if item.started is not None else "")
        return Group(table, Text(summary))
