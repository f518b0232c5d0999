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
    header: dict  # rank, host, pid, python, library (the folders of Python's and the packages' code)
    threads: list[Thread]

    @property
    def dumped(self) -> bool:
        return bool(self.threads)

    def main(self) -> Thread | None:
        """The main thread (the one whose outermost frame is not threading's), else the first thread."""
        return next((t for t in self.threads if t.is_main), self.threads[0] if self.threads else None)


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
    return Dump(header, [t for t in threads if t.frames])
