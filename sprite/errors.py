"""sprite's error types and exit codes.

Every error a user can cause is a :class:`SpriteError` whose message has three parts: what happened, the
usual cause, and the fix. The CLI prints it as one line (no traceback) and exits with ``exit_code``.
"""

from __future__ import annotations

from typing import Callable

EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_USAGE = 2
EXIT_STALLED = 124

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


def exit_with(err: SpriteError) -> None:
    """Print ``err`` with :func:`report` on stderr and exit with its code (2 when it has none)."""
    import sys

    print(report(err), file=sys.stderr, flush=True)
    sys.exit(err.exit_code or EXIT_USAGE)
