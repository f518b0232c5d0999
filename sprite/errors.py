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
