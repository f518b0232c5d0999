"""sprite's error types and exit codes.

Every error a user can cause is a :class:`SpriteError` whose message has three parts: what happened, the
usual cause, and the fix. The CLI prints it as one line (no traceback) and exits with ``exit_code``.
"""

from __future__ import annotations

import reprlib
from typing import Callable

EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_USAGE = 2
EXIT_STALLED = 124
# The ranks saved a checkpoint after the preemption signal and stopped: run again with --resume auto.
# 75 is sysexits.h's EX_TEMPFAIL ("a temporary failure; the user is invited to retry later"): no launcher,
# scheduler or signal (128+N) gives it another meaning.
EXIT_PREEMPTED = 75

# A value checker's way to refuse: complain(what is wrong, what is allowed) builds the error it raises.
Complain = Callable[[str, str], Exception]


class SpriteError(Exception):
    """A failure the user can act on. ``str(err)`` is the whole message."""

    exit_code = EXIT_CHECK_FAILED

    def __init__(self, what: str, cause: str = "", fix: str = ""):
        self.what, self.cause, self.fix = what, cause, fix
        super().__init__(" ".join(part for part in (what, cause, fix) if part))


class UsageError(SpriteError):
    """Bad input: a flag, a spec file, a script path, an allocation that cannot hold the request."""

    exit_code = EXIT_USAGE


class SpecError(UsageError):
    """A job spec or site profile rejected during validation; names the file, line and key."""

    def __init__(self, source: str, line: int | None, key: str, what: str, allowed: str = ""):
        where = f"{source}:{line}" if line else source
        fix = f"Allowed: {allowed}." if allowed else ""
        super().__init__(f"{where}: key '{key}': {what}", "", fix)
        self.source, self.line, self.key = source, line, key


# reprlib bounds a value's repr without building the whole of it first (a 60 KB string, a list of 10,000 hosts).
class _Repr(reprlib.Repr):
    # repr() of an int over 4,300 digits raises ValueError (sys.int_info.default_max_str_digits)
    def repr_int(self, x, level):
        return repr(x) if x.bit_length() <= 128 else f"<an integer of {int(x.bit_length() * 0.30103) + 1} digits>"


_SHOW = _Repr()  # keyword arguments need Python 3.12
_SHOW.maxlevel, _SHOW.maxstring, _SHOW.maxother, _SHOW.maxlong = 3, 80, 80, 40
_SHOW.maxlist = _SHOW.maxdict = _SHOW.maxtuple = _SHOW.maxset = 6


def show(value: object) -> str:
    """``repr(value)`` cut to about 80 characters and a few items per level, for quoting input in a message."""
    return _SHOW.repr(value)


def preview(items, limit: int = 4) -> str:
    """The first ``limit`` items joined by ", ", then how many more: hosts in a message never list them all."""
    items = list(items)
    head = ", ".join(show(item) if not isinstance(item, str) else one_line(item, 80) for item in items[:limit])
    return head + (f", ... ({len(items)} in all)" if len(items) > limit else "")


def size_text(size: int | None) -> str:
    """A byte count as a person reads it: "512 B", "129.3 KiB", "1.9 GiB"; "-" for None."""
    if size is None:
        return "-"
    if size < 1024:
        return f"{size} B"
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        size /= 1024
        if size < 1024 or unit == "TiB":
            return f"{size:.1f} {unit}"


MAX_MESSAGE = 2000  # characters of one printed error line; longer messages are cut with a note


def one_line(text: str, limit: int = MAX_MESSAGE) -> str:
    """``text`` on one line: control characters escaped (a newline shows as \\n), at most ``limit`` characters."""
    flat = "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)
    if len(flat) <= limit:
        return flat
    return flat[:limit] + f" ... ({len(flat) - limit} more characters cut)"


def report(err: BaseException) -> str:
    """The one way sprite prints an error, in every entry point: ``sprite: error: <message>`` on one line."""
    return "sprite: error: " + one_line(str(err))


_PATH_ERRNOS = ("ENOENT", "EACCES", "EPERM", "ENOTDIR", "EISDIR", "ENAMETOOLONG", "ELOOP", "EROFS", "EEXIST")


def from_os_error(err: OSError) -> SpriteError:
    """The one-line error for an OSError no command caught: a path that is missing, not what is needed there, or
    not this user's to read or write is bad input (exit 2); any other (a full disk) is a failure (exit 1)."""
    import errno

    name = errno.errorcode.get(err.errno or 0, "")
    where = " and ".join(repr(str(path)) for path in (err.filename, err.filename2) if path is not None)
    what = f"{err.strerror or type(err).__name__}{': ' + where if where else ''}."
    if name in _PATH_ERRNOS:
        return UsageError(what, "A path given to sprite is missing, is a file where a folder is needed (or the other "
                          "way round), or this user may not read or write it.",
                          "Check the path and its permissions, then run the command again.")
    return SpriteError(what, "The file system refused the operation (full, read-only or failing).",
                       "Free space or fix the file system, then run the command again.")


def exit_with(err: SpriteError) -> None:
    """Print ``err`` with :func:`report` on stderr and exit with its code (2 when it has none)."""
    import sys

    print(report(err), file=sys.stderr, flush=True)
    sys.exit(err.exit_code or EXIT_USAGE)
