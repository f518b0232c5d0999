"""The console-rank grammar both halves read: which ranks print to the console (``--ranks``, spec ``ranks:``)
and where an attempt's rank logs go. The launcher plans with it; each rank's runtime filters its own output with it.
Pure and import-light.
"""

from __future__ import annotations

import re
from typing import Any

from sprite.errors import Complain, UsageError

# Every rank on the console up to this many ranks; rank 0 alone beyond. 16 covers one whole node of every
# shipped site (Aurora 12 tiles; Polaris and Perlmutter 4 GPUs, so up to 4 of their nodes), where a line that
# every rank prints still fits on one screen; at 24 ranks (2 Aurora nodes) and up it no longer does.
ALL_RANKS_UP_TO = 16
RANKS_ALLOWED = "0, all, or a list of ranks such as 0,3,8-11"
_LIST = re.compile(r"\d+(-\d+)?(,\d+(-\d+)?)*")


def check_ranks(value: Any, complain: Complain) -> str:
    """A console filter: "0", "all" or a list of ranks and ranges. Raises ``complain(...)`` otherwise."""
    text = str(value).strip() if isinstance(value, (str, int)) and not isinstance(value, bool) else ""
    if text != "all" and not _LIST.fullmatch(text):
        raise complain(f"{value!r} is not a set of ranks.", RANKS_ALLOWED)
    for start, end in _ranges(text):
        if end < start:
            raise complain(f"{value!r} has the range {start}-{end}, which runs backwards.", RANKS_ALLOWED)
    return text


def _ranges(text: str) -> list[tuple[int, int]]:
    if text == "all":
        return []
    return [(int(a), int(b or a)) for a, _, b in (part.partition("-") for part in text.split(","))]


def console_ranks(requested: str | None, size: int) -> str:
    """The filter in force: the requested one, else every rank up to ``ALL_RANKS_UP_TO`` ranks, else rank 0.

    Raises UsageError when the requested ranks are all outside the world (the console would stay silent).
    """
    if requested and not members(requested, size):
        raise UsageError(f"--ranks {requested} names no rank of this launch, which has ranks 0-{size - 1}.",
                         "", "Name ranks below the world size, or use --ranks all.")
    return requested or ("all" if size <= ALL_RANKS_UP_TO else "0")


def members(spec: str, size: int) -> list[int]:
    """The ranks of a world of ``size`` that ``spec`` shows, in order."""
    if spec == "all":
        return list(range(size))
    return sorted({r for start, end in _ranges(spec) for r in range(start, min(end, size - 1) + 1)})


def shows_all(spec: str, size: int) -> bool:
    return members(spec, size) == list(range(size))


def attempt_dir(log_dir: str | None, attempt: str | None) -> str | None:
    """Where this attempt's rank logs go: ``DIR`` for the first launch, ``DIR/attempt<N>`` for relaunch N
    (``sprite run --retries``), so no attempt appends to or replaces another's logs (as torchrun's attempt_N)."""
    if not log_dir or not attempt or attempt == "1":
        return log_dir
    return f"{log_dir}/attempt{attempt}"
