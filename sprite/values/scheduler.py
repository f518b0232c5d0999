"""Value checkers of a ``scheduler:`` block (and a site's ``submit:`` and ``queues:``): what reaches a job script.

Every value that reaches a ``#PBS``/``#SBATCH`` directive must be a plain token (letters, digits and
``_ . , : = @ % + / -``): qsub and sbatch read directives with their own parsers, not the shell's, so no
quoting can make a space, quote or ``$`` safe there. Checkers follow ``sprite.values.grammar``: ``(value, complain)``.

Setup lines are trusted shell: they run in the job, with the submitting user's rights, before the launch, and
sprite does not sandbox them (``eval``, ``bash -c``, ``PATH=...`` run as written). Each word is shell-quoted
when rendered, so shell syntax (``$HOME``, ``;``, ``|``) would reach the command as literal text instead of
doing what it looks like: that is refused, to catch the mistake, not as a security boundary.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

from sprite.errors import Complain, UsageError, show
from sprite.values.env import hide_values, kind_of
from sprite.values.grammar import scalar_text, control_char

TOKEN = re.compile(r"[A-Za-z0-9_.,:=@%+/-]+")
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
WALLTIME = re.compile(r"([0-9]{1,3}):([0-5][0-9]):([0-5][0-9])")
SIGNAL = re.compile(r"(?:SIG)?(USR1|USR2)@([0-9]{1,5})")  # the preemption signals sprite handles (preemption.py)
PLACE = re.compile(r"(free|pack|scatter|vscatter|excl|shared|exclhost)(:(excl|shared|exclhost|group=[a-z]+))*")
# One PBS chunk's resources (ncpus=2:mpiprocs=2): sprite writes select=<nodes>:<chunk>, so no count, no second
# chunk (+), no further -l resource (a comma starts one: "2,walltime=72:00:00" would pass the queue limits).
CHUNK = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=[A-Za-z0-9_.-]+(:[A-Za-z_][A-Za-z0-9_]*=[A-Za-z0-9_.-]+)*")
PROGRAM = re.compile(r"[A-Za-z0-9_./][A-Za-z0-9_.,:=@%+/-]*")
SHELL_SYNTAX = re.compile(r"[$`;&|<>(){}\\!*?\[\]~#]")
TOKEN_ALLOWED = "letters, digits and _ . , : = @ % + / - (no spaces, quotes, $ or control characters)"
SETUP_TRUST = ("setup lines are trusted shell: each runs in the job with your rights, and sprite quotes every "
               "word, so shell syntax would arrive as literal text")


def _shown(value) -> str:
    """``value`` quoted for a message, with secret-looking assignments' values hidden (a setup line or a directive
    may carry one)."""
    return show(hide_values(value)) if isinstance(value, str) else kind_of(value)


def token(value: Any, complain: Complain) -> str:
    """A directive-safe token. Raises ``complain(...)`` for anything else."""
    text = scalar_text(value)
    if text is None:
        raise complain(f"{_shown(value)} is not a string.", TOKEN_ALLOWED)
    if not TOKEN.fullmatch(text):
        raise complain(f"{_shown(text)} cannot be written safely into a #PBS/#SBATCH directive.", TOKEN_ALLOWED)
    return text


def _matching(value: Any, complain: Complain, pattern: re.Pattern, what: str, allowed: str) -> str:
    """A directive-safe token that ``pattern`` matches whole; else ``complain`` that it is not ``what``."""
    text = token(value, complain)
    if not pattern.fullmatch(text):
        raise complain(f"{_shown(text)} is not {what}.", allowed)
    return text


def name(value: Any, complain: Complain) -> str:
    return _matching(value, complain, NAME, "a plain name",
                     "up to 128 letters, digits, _ . - (starting with a letter or digit)")


def walltime(value: Any, complain: Complain) -> str:
    text = value if isinstance(value, str) else ""
    match = WALLTIME.fullmatch(text)
    if not match or seconds(text) < 1:
        raise complain(f"{_shown(value)} is not a walltime in HH:MM:SS of at least one second (00:00:00 would mean "
                       "no limit to Slurm).", '"HH:MM:SS" with minutes and seconds below 60, e.g. "01:00:00"')
    return text


def seconds(walltime_text: str) -> int:
    hours, minutes, secs = (int(part) for part in walltime_text.split(":"))
    return hours * 3600 + minutes * 60 + secs


def names(value: Any, complain: Complain) -> tuple[str, ...]:
    """A list (or ``a:b`` string) of plain names, e.g. filesystems ``[home, flare]``."""
    items = value.split(":") if isinstance(value, str) else value
    if not isinstance(items, list) or not items:
        raise complain(f"{_shown(value)} is not a list of names.", "a YAML list such as [home, flare]")
    return tuple(name(item, complain) for item in items)


def place(value: Any, complain: Complain) -> str:
    return _matching(value, complain, PLACE, "a PBS placement", "free, pack or scatter, optionally :excl, :shared, "
                     ":exclhost or :group=<resource>, e.g. scatter or scatter:excl")


def select(value: Any, complain: Complain) -> str:
    """The resources of one PBS chunk (``ncpus=2:mpiprocs=2``); sprite prepends the node count itself."""
    text = token(value, complain)
    if not CHUNK.fullmatch(text) or re.search(r"(^|:)(walltime|place|select|nodes|filesystems)=", text):
        raise complain(f"{_shown(text)} is not the resources of one chunk; sprite writes select=<nodes>:<this>, "
                       "and walltime, place and filesystems have keys of their own.",
                       "resource=value pairs joined by ':', e.g. ncpus=2:mpiprocs=2 or system=polaris")
    return text


def program(value: Any, complain: Complain) -> str:
    """The interpreter the job runs (``python``): a path or command name, never an option such as ``-c``."""
    text = token(value, complain)
    if not PROGRAM.fullmatch(text):
        raise complain(f"{_shown(text)} is not a program path or name (it would be read as an option).",
                       "a path such as /opt/conda/bin/python, or python3")
    return text


def dependency(value: Any, complain: Complain) -> tuple[str, ...]:
    """Job ids that must finish successfully first (afterok). ``afterok:1:2`` or a list of ids."""
    if isinstance(value, str) and value.startswith("afterok:"):
        value = value[len("afterok:"):].split(":")
    items = value if isinstance(value, list) else [value]
    return tuple(name(item, lambda what, allowed: complain(
        what, "afterok:<job id>[:<job id>...] or a list of job ids, e.g. afterok:123456")) for item in items)


def preempt_signal(value: Any, complain: Complain) -> tuple[str, int]:
    match = SIGNAL.fullmatch(value) if isinstance(value, str) else None
    if not match or int(match.group(2)) < 1:
        raise complain(f"{_shown(value)} is not SIGNAL@SECONDS.", "USR1 or USR2 (the signals on which sprite's ranks "
                       "checkpoint and stop), then @ and the seconds before the walltime ends (fewer than the "
                       "walltime), e.g. USR1@90")
    return match.group(1), int(match.group(2))


def directives(value: Any, complain: Complain) -> tuple[str, ...]:
    """Extra directive options such as ``-l debug=true`` or ``--mail-type=END``, each word a safe token."""
    items = value if isinstance(value, list) else None
    if items is None or not all(isinstance(item, str) for item in items):
        raise complain(f"{_shown(value)} is not a list of strings.", 'a YAML list such as ["--mail-type=END"]')
    for item in items:
        words = item.split(" ")
        if not item.startswith("-") or not all(words):
            raise complain(f"{_shown(item)} is not a directive option.", "an option starting with -, words separated "
                           "by single spaces, e.g. -l debug=true")
        for word in words:
            token(word, complain)
    return tuple(items)


def setup(value: Any, complain: Complain) -> tuple[tuple[str, ...], ...]:
    """Set-up commands (``module load frameworks``), trusted shell split into words (see the module docstring)."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(item, str) for item in items):
        raise complain(f"{_shown(value)} is not a list of commands.", 'a YAML list such as ["module load frameworks"]')
    out = []
    for item in items:
        if control_char(item) or SHELL_SYNTAX.search(item):
            raise complain(f"{_shown(item)} holds shell syntax or a control character; {SETUP_TRUST}.",
                           "a command and plain arguments such as module load frameworks; for shell code, "
                           "put it in a file and write: source /path/to/file.sh")
        try:
            out.append(tuple(shlex.split(item)))
        except ValueError as err:
            raise complain(f"{_shown(item)} cannot be split into words ({err}).", "quotes that close") from None
    return tuple(words for words in out if words)


def directive_word(key: str, value) -> str:
    """``value`` as directive text that needs no quoting. Raises UsageError naming ``key`` otherwise.

    Values were checked to be directive-safe tokens when the block was validated; here each is still passed
    through ``shlex.quote`` and must come back unchanged, so a token that would need quoting can never reach a
    directive even if a caller skipped validation.
    """
    text = str(value)
    if shlex.quote(text) != text or not text:
        raise UsageError(
            f"scheduler.{key} = {_shown(text)} cannot be written into a job-script directive.",
            "qsub and sbatch read directives with their own parsers, so quoting cannot protect spaces, "
            "quotes, $ or control characters there.",
            "Use letters, digits and _ . , : = @ % + / - only.",
        )
    return text


def directive_words(item: str) -> str:
    """An ``extra`` directive option, every space-separated word checked by ``directive_word``."""
    return " ".join(directive_word("extra", word) for word in item.split(" "))
