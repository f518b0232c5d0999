"""Where one rank was, in one phrase: from its main thread's stack and its flight recorder summary.

A frame is the user's unless its file lies in a folder the rank named as library code (Python's own, the
installed packages', sprite's) or is frozen (``<frozen runpy>``). The kinds, in the order they are tried:
a public function of ``torch/distributed/distributed_c10d.py`` on the stack is a collective (named by the
outermost one, the call the code made); autograd's backward is where DDP waits for its gradient all-reduce;
otherwise the innermost user frame says where the rank's own code was (inside the data loader when torch's
data loader called it) unless torch's data loader is further in (waiting for its workers), or that frame is only
the script's entry point (then the rank is in the library code it called).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sprite.contract import stacks
from sprite.recovery.hang.frames import Dump, Frame

COLLECTIVE, BACKWARD, USER, DATA, LIBRARY, NONE = "collective", "backward", "user", "data", "library", "none"
WAITING = (COLLECTIVE, BACKWARD)  # kinds that wait for other ranks
_C10D = "torch/distributed/distributed_c10d.py"
_WRAPPERS = ("torch/distributed/c10d_logger.py", _C10D)
_BACKWARD = (("torch/autograd/graph.py", "_engine_run_backward"), ("torch/autograd/__init__.py", "backward"),
             ("torch/_tensor.py", "backward"))
_DATALOADER = "torch/utils/data/"
SOURCE_MAX = 1 << 20  # bytes of a user's source file read to quote one line


@dataclass(frozen=True)
class Where:
    kind: str
    text: str
    direct: bool = False  # a collective the rank's own code called (not the framework)
    op: str = ""


def is_library(frame: Frame, folders: list[str]) -> bool:
    path = frame.path
    if path.startswith("<"):
        return True
    if folders:
        return any(path.startswith(folder.rstrip("/") + "/") for folder in folders)
    return any(mark in path for mark in ("/site-packages/", "/dist-packages/", "/lib/python3"))


def of(dump: Dump | None, quote=None) -> Where:
    """The Where of one rank's dump (``quote(frame)``: that frame's source line, or "")."""
    thread = dump.main() if dump else None
    if thread is None:
        return Where(NONE, "wrote no stacks (no dump: it kept advancing, was gone, or could not write)")
    frames, quote = thread.frames, quote or source_line
    folders = [f for f in dump.header.get("library", []) if isinstance(f, str)]
    user = [i for i, f in enumerate(frames) if not is_library(f, folders)]
    public = [i for i, f in enumerate(frames) if f.path.endswith(_C10D) and not f.func.startswith("_")
              and f.func != "wrapper"]
    if public:
        return _collective(frames, max(public), user, folders, quote)
    if any(f.path.endswith(p) and f.func == func for f in frames for p, func in _BACKWARD):
        return Where(BACKWARD, "waiting in backward (where DDP all-reduces the gradients)")
    inner = frames[0]
    if not user:
        kind = DATA if any(_DATALOADER in f.path for f in frames) else LIBRARY
        return Where(kind, f"{'waiting for the data loader' if kind == DATA else ''} in {_name(inner)}".lstrip())
    mine = frames[user[0]]
    if any(_DATALOADER in f.path for f in frames[:user[0]]):
        return Where(DATA, f"waiting for the data loader in {_name(inner)} under {_name(mine)}")
    hook = user[0] + 1 < len(frames) and is_library(frames[user[0] + 1], folders)  # the framework called it
    if user[0] > 0 and not hook:  # only the script's entry point: the rank is in library code it called
        return Where(LIBRARY, f"in {_name(inner)} under {_name(mine)}")
    text = f"stuck in {_name(mine, quote)}" + (f" in {_name(inner)}" if user[0] > 0 else "")
    loader = any(_DATALOADER in f.path for f in frames[user[0] + 1:])
    return Where(USER, text + (" inside the data loader" if loader else ""))


def _collective(frames: list[Frame], top: int, user: list[int], folders: list[str], quote) -> Where:
    """The collective called at ``frames[top]``: who called it, and whether that was the user's own code;
    when it was the framework, the user's call that led there."""
    caller = next((f for f in frames[top + 1:] if not f.path.endswith(_WRAPPERS)), None)
    direct = caller is not None and not is_library(caller, folders)
    called = f" called from {_name(caller)}" if caller else ""
    mine = [i for i in user if i > top and frames[i].func != "<module>"]
    if mine and not direct:
        called += f" under {_name(frames[mine[0]], quote)}"
    return Where(COLLECTIVE, f"waiting in {frames[top].func}{called}", direct, frames[top].func)


def _name(frame: Frame, quote=None) -> str:
    """``func (file.py:N)``, or ``func (file.py:N: its source line)`` with ``quote``."""
    line = quote(frame) if quote else ""
    return f"{frame.func} ({frame.short}{': ' + line if line else ''})"


def source_line(frame: Frame, limit: int = 60) -> str:
    """The stripped source line of ``frame`` when its file is an absolute path to a regular file, cut to
    ``limit`` characters; "" otherwise."""
    if not frame.path.startswith("/"):
        return ""
    data = stacks.read(Path(frame.path), SOURCE_MAX)
    lines = data.decode(errors="replace").splitlines() if data else []
    if not 0 < frame.line <= len(lines):
        return ""
    text = " ".join(lines[frame.line - 1].split())
    return text if len(text) <= limit else text[:limit - 3] + "..."


def collectives(summary: dict | None) -> tuple[str, int | None]:
    """One phrase for a rank's flight recorder summary and its default group's last enqueued sequence number
    (None when unknown): "all_reduce #13 (161 Float) not completed" or why there is none. Three process groups
    at most, those with a collective not completed first, then how many more."""
    if not isinstance(summary, dict):
        return "", None
    if summary.get("none"):
        return str(summary["none"]), None
    groups = [g for g in summary.get("groups") or [] if isinstance(g, dict)]
    parts, seq = [], None
    for group in groups:
        last = group.get("last") if isinstance(group.get("last"), dict) else None
        enqueued, completed = group.get("last_enqueued"), group.get("last_completed")
        if str(group.get("pg")) == "0" and isinstance(enqueued, int):
            seq = enqueued
        if last is None:
            continue
        sizes = ",".join("x".join(str(n) for n in s) for s in last.get("sizes") or [] if isinstance(s, list))
        what = f"{last.get('op')} #{last.get('seq')}" + (f" ({sizes})" if sizes else "")
        state = "completed" if last.get("completed") else f"not completed (completed up to #{completed})"
        name = "" if str(group.get("pg")) == "0" else f" on group {group.get('name') or group.get('pg')}"
        parts.append((bool(last.get("completed")), f"{what}{name} {state}"))
    shown = [text for _, text in sorted(parts, key=lambda part: part[0])]  # stable: the not completed first
    more = len(shown) - 3
    more = f"; {more} more process group{'s' if more > 1 else ''}" if more > 0 else ""
    return "; ".join(shown[:3]) + more, seq


def pending(summary: dict | None) -> bool:
    """Whether the flight recorder shows a collective this rank started and that has not completed: the rank
    waits for others even when its stack shows no collective (NCCL's calls return at once; the rank blocks
    later, at its next synchronisation)."""
    groups = summary.get("groups") if isinstance(summary, dict) else None
    return any(_unfinished(g) for g in groups or [] if isinstance(g, dict))


def _unfinished(group: dict) -> bool:
    """The group's last entry not completed; without an entry, its last enqueued sequence number past its last
    completed one. The entry comes first: the group's last completed number can lag behind the entry (seen under
    srun here: #34 enqueued, its entry completed, the group's last completed #33)."""
    last = group.get("last")
    if isinstance(last, dict) and "completed" in last:
        return not last["completed"]
    enqueued, completed = group.get("last_enqueued"), group.get("last_completed")
    return isinstance(enqueued, int) and isinstance(completed, int) and enqueued > completed
