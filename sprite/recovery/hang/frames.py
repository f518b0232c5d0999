"""A rank's stack file read back: the header sprite wrote, then the threads and frames ``faulthandler`` printed.

faulthandler prints each thread as ``Thread 0x... (most recent call first):`` (``Current thread`` for the one
holding the GIL) followed by ``  File "PATH", line N in FUNCTION`` lines, innermost first, at most 100 frames.
Anything else (a ``Timeout (0:00:08)!`` line, ``<no Python frame>``, ``...`` for cut frames) is skipped.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

from sprite.contract import stacks

_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-fA-F]+)\b.*\(most recent call first\):\s*$")
_FRAME = re.compile(r'^  File "(.*)", line (\d+) in (.*)$')
_TIMEOUT = re.compile(r"^Timeout \(")


@dataclass(frozen=True)
class Frame:
    path: str
    line: int
    func: str

    @property
    def short(self) -> str:
        return f"{self.path.rsplit('/', 1)[-1]}:{self.line}"


@dataclass
class Thread:
    ident: str
    frames: list[Frame] = field(default_factory=list)  # innermost first, as faulthandler prints them

    @property
    def is_main(self) -> bool:
        """A thread started by ``threading`` ends (outermost) in threading.py's ``_bootstrap``; the main
        thread does not."""
        return bool(self.frames) and not (self.frames[-1].path.endswith("threading.py")
                                          and self.frames[-1].func.startswith("_bootstrap"))


@dataclass
class Dump:
    header: dict  # rank, host, pid, python, library (the folders of Python's and the packages' code), main_thread
    threads: list[Thread]  # those with Python frames
    printed: frozenset = frozenset()  # the idents of every thread the dump printed, frames or not (lower case)

    @property
    def main_ident(self) -> str | None:
        """The main thread's ident as faulthandler prints it (``0x%016x``), where the rank's header names it."""
        found = self.header.get("main_thread")
        return found.lower() if isinstance(found, str) else None

    @property
    def dumped(self) -> bool:
        """Whether the dump is whole: it printed a thread, and the main thread where the header names it
        (faulthandler prints the main thread last; a dump read before that is still being written)."""
        return bool(self.threads) and (self.main_ident is None or self.main_ident in self.printed)

    def main(self) -> Thread | None:
        """The main thread: the one the header names, else the one whose outermost frame is not threading's (a
        thread started outside ``threading``, by C code, has none either), else the first thread."""
        named = next((t for t in self.threads if t.ident.lower() == self.main_ident), None)
        return named or next((t for t in self.threads if t.is_main), self.threads[0] if self.threads else None)


def parse(text: str) -> Dump:
    """The header and the threads of the last dump in ``text`` (a dump after progress is cut away by the rank,
    so there is one at most; a second one counts from its ``Timeout`` line)."""
    lines = text.splitlines()
    header = {}
    if lines and lines[0].startswith(stacks.HEADER):
        try:
            found = json.loads(lines[0][len(stacks.HEADER):])
            header = found if isinstance(found, dict) else {}
        except ValueError:
            header = {}
    threads: list[Thread] = []
    for line in lines:
        if _TIMEOUT.match(line):
            threads = []
        elif thread := _THREAD.match(line):
            threads.append(Thread(thread.group(2)))
        elif (frame := _FRAME.match(line)) and threads:
            threads[-1].frames.append(Frame(frame.group(1), int(frame.group(2)), frame.group(3)))
    return Dump(header, [t for t in threads if t.frames], frozenset(t.ident.lower() for t in threads))
