"""Value checkers of a job spec, a site profile and the command line; a job's environment variables have theirs
in ``sprite.values.env``, a ``scheduler:`` block's directive-bound values in ``sprite.values.scheduler``.

Each checker takes the raw value and ``complain(what, allowed)`` and returns the clean value or raises what
``complain`` builds (a SpecError naming file, line and key, or a UsageError naming the flag). Raw values are
text as written (``sprite.spec.yamldoc`` keeps YAML scalars as text, flags are text) or, from Python callers, ints
and bools; each checker decides what its key means, so ``010``, ``yes`` and ``"²"`` are read or refused here,
once, with the reason. Integers are parsed once, after a length check, against a range.
"""

from __future__ import annotations

import re
import shlex
from typing import Any, Callable

import hostlist

from sprite.errors import Complain, show

INTEGER = re.compile(r"-?([0-9]+)")  # ASCII digits: str.isdigit() also accepts "²", which int() then refuses
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
HOST = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,252}")
DECIMAL = re.compile(r"[0-9]{1,12}(\.[0-9]{0,12})?([eE][+-]?[0-9]{1,3})?")  # ASCII, no "_", "inf" or "nan"
# Ceilings above any machine (the largest has about 160,000 nodes; Aurora 10,624 nodes of 208 hardware threads):
# a site profile's limits: block narrows them to its own facts.
MAX_NODES = 200_000
MAX_RANKS_PER_NODE = 1024


def control_char(text: str) -> str | None:
    """The first newline or other control character in ``text``, else None."""
    return next((ch for ch in text if ord(ch) < 32 or 127 <= ord(ch) < 160), None)


def scalar_text(value: Any) -> str | None:
    """``value`` as text when it is a scalar (text or a Python int), else None. bool is not an int here."""
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value) if value.bit_length() <= 64 else "9" * 20  # only its size matters past this
    return None


def whole(low: int, high: int, span: str = "") -> Callable[[Any, Complain], int]:
    """A checker for a whole number in ``low..high`` (called ``span`` in messages), written in decimal digits
    without a leading zero."""
    span = span or f"{low}..{high}"
    def check(value: Any, complain: Complain) -> int:
        text = scalar_text(value)
        match = INTEGER.fullmatch(text) if text is not None else None
        if not match:
            raise complain(f"{show(value)} is not a whole number.", f"an integer from {low} to {high}")
        digits = match.group(1)
        if len(digits) > 1 and digits.startswith("0"):
            raise complain(f"{show(value)} has a leading zero (YAML 1.1 tools read 010 as octal 8).",
                           f"the number without leading zeros, from {low} to {high}")
        if len(digits) > len(str(high)) or not low <= int(text) <= high:
            raise complain(f"{show(value)} is outside {span}.", f"an integer from {low} to {high}")
        return int(text)
    return check


nodes = whole(1, MAX_NODES)
ranks_per_node = whole(1, MAX_RANKS_PER_NODE)
per_node = whole(1, MAX_RANKS_PER_NODE)  # cores, GPUs or threads of one node
port = whole(1024, 65535, "the unprivileged port range 1024..65535")
non_negative_int = whole(0, MAX_NODES)  # retries, spare nodes


def flag(value: Any, complain: Complain) -> bool:
    """true or false (also True/TRUE/False/FALSE). yes/no/on/off are refused: YAML 1.1 read them as booleans."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise complain(f"{show(value)} is not true or false.", "true or false")


def signal_name(value: Any, complain: Complain) -> str:
    """A preemption signal for ``sprite run``: USR1, USR2 (a SIG prefix is dropped) or none."""
    text = value.strip().upper().removeprefix("SIG") if isinstance(value, str) else ""
    text = "none" if text == "NONE" else text
    if text not in ("USR1", "USR2", "none"):
        raise complain(f"{show(value)} is not a preemption signal sprite handles.", "USR1 (the default), USR2 or none")
    return text


def choice(options: tuple[str, ...]):
    """A checker accepting exactly one of ``options``."""
    def check(value: Any, complain: Complain) -> str:
        text = scalar_text(value)
        if text not in options:
            raise complain(f"{show(value)} is not a valid choice.", ", ".join(options))
        return text
    return check


def switch(options: tuple[str, ...]):
    """``choice(options)`` that also takes a Python bool (True: the first option, False: the second), for
    options that read as on and off. A spec's ``on``/``yes`` is text here (sprite.spec.yamldoc), never a bool."""
    plain = choice(options)

    def check(value: Any, complain: Complain) -> str:
        return options[0 if value else 1] if isinstance(value, bool) else plain(value, complain)
    return check


def text_list(value: Any, complain: Complain) -> tuple[str, ...]:
    """A list of one-line texts (e.g. shell-style patterns), or one comma-separated string."""
    items = [part for part in value.split(",") if part] if isinstance(value, str) else value
    if not isinstance(items, list) or any(scalar_text(item) is None for item in items):
        raise complain(f"{show(value)} is not a list of strings.", "a YAML list such as [a, b]")
    words = tuple(scalar_text(item) for item in items)
    bad = next((word for word in words if control_char(word)), None)
    if bad is not None:
        raise complain(f"{show(bad)} holds a control character.", "printable text")
    return words


MAX_SECONDS = 3650 * 86400.0  # ten years: longer than any allocation; a larger figure is a typo (and 1e308 * 10 is inf)


def duration(value: Any, complain: Complain) -> float:
    """Seconds, a positive finite decimal number (``600``, ``0.5``, ``1e3``; an int or a float from Python) of at
    most MAX_SECONDS."""
    text = scalar_text(value) if not isinstance(value, float) else repr(value)
    number = float(text) if text is not None and DECIMAL.fullmatch(text) else None
    if number is None or not 0 < number < float("inf"):
        raise complain(f"{show(value)} is not a positive number of seconds.", "seconds above 0, e.g. 600")
    if number > MAX_SECONDS:
        raise complain(f"{show(value)} seconds is more than ten years.", f"seconds above 0 and at most "
                       f"{MAX_SECONDS:.0f}, e.g. 600")
    return number


SPAN = re.compile(r"([0-9]{1,12}(?:\.[0-9]{0,12})?)\s*(s|sec|min|h|d)?")
SPAN_UNITS = {None: 1.0, "s": 1.0, "sec": 1.0, "min": 60.0, "h": 3600.0, "d": 86400.0}
SPAN_ALLOWED = "a duration above 0: seconds (90) or with a unit: 30s, 10min, 1.5h, 7d"


def span(value: Any, complain: Complain) -> float:
    """Seconds from a duration with an optional unit (``90``, ``30s``, ``10min``, ``1.5h``, ``7d``)."""
    text = scalar_text(value) if not isinstance(value, float) else repr(value)
    match = SPAN.fullmatch(text.strip()) if text is not None else None
    number = float(match.group(1)) * SPAN_UNITS[match.group(2)] if match else None
    if number is None or not 0 < number < float("inf"):
        raise complain(f"{show(value)} is not a duration.", SPAN_ALLOWED)
    if number > MAX_SECONDS:
        raise complain(f"{show(value)} is more than ten years.", SPAN_ALLOWED + f", at most {MAX_SECONDS:.0f} s")
    return number


def cadence(value: Any, complain: Complain) -> str:
    """``checkpoint_every``: ``auto`` (Young/Daly from the MTBF) or a duration, kept as seconds in text."""
    if scalar_text(value) == "auto":
        return "auto"
    return repr(span(value, lambda what, allowed: complain(what, f"auto, or {allowed}")))


MIN_TIMEOUT = 1.0  # seconds; ranks beat at most every 0.5 s (recovery.watchdog.heartbeat_seconds)


def timeout(value: Any, complain: Complain) -> float:
    """A watchdog allowance: ``duration`` of at least MIN_TIMEOUT (a shorter one ends a healthy run between two
    heartbeats)."""
    number = duration(value, complain)
    if number < MIN_TIMEOUT:
        raise complain(f"{show(value)} seconds is shorter than the heartbeat, so every run would stall.",
                       f"seconds of at least {MIN_TIMEOUT:g}, e.g. 600")
    return number


def string(value: Any, complain: Complain) -> str:
    """Non-empty text without control characters (a path or a name)."""
    if not isinstance(value, str) or not value:
        raise complain(f"{show(value)} is not a non-empty string.", "a path or name in quotes if need be")
    bad = control_char(value)
    if bad:
        raise complain(f"{show(value)} holds the control character {bad!r}.", "printable text")
    return value


def arguments(value: Any, complain: Complain) -> tuple[str, ...]:
    """Script arguments: a list of scalars, or one string split like a shell would (``--lr 0.1,0.2`` is two
    words; commas stay inside words). Refuses an unbalanced quote, nested lists and control characters."""
    if isinstance(value, str):
        try:
            value = shlex.split(value)
        except ValueError as err:
            raise complain(f"{show(value)} cannot be split into words ({err}).",
                           "a YAML list of arguments, or quotes that close") from None
    if not isinstance(value, list) or any(scalar_text(item) is None for item in value):
        raise complain(f"{show(value)} is not a list of arguments.", 'a YAML list such as [--max-steps, "100"]')
    words = tuple(scalar_text(item) for item in value)
    for word in words:
        bad = control_char(word.replace("\t", " "))
        if bad:
            raise complain(f"{show(word)} holds the control character {bad!r}.", "printable arguments")
    return words


def hosts(value: Any, complain: Complain) -> tuple[str, ...]:
    """Host lists to exclude: a list, or one string; each item a host or bracket list (``nid[001-003,007]``)."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or any(not isinstance(item, str) or not item for item in items):
        raise complain(f"{show(value)} is not a list of hosts.", "a YAML list of host names such as [nid001]")
    for item in items:
        try:
            expanded = hostlist.expand_hostlist(item)
        except hostlist.BadHostlist as err:
            raise complain(f"{show(item)} is not a host name or host list ({err}).",
                           "host names such as nid001, or a bracket list such as nid[001-003,007]") from None
        bad = next((host for host in expanded if not HOST.fullmatch(host)), None) if expanded else item
        if bad is not None:
            raise complain(f"{show(bad)} is not a host name.", "letters, digits, _ . - (starting with a letter "
                           "or digit), or a bracket list such as nid[001-003,007]")
    return tuple(items)


def resume(value: Any, complain: Complain) -> str:
    if not isinstance(value, str) or not value.strip():
        raise complain(f"{show(value)} is not never, auto or a checkpoint path.", "never, auto, or a checkpoint path")
    return value.strip()


def mapping(value: Any, complain: Complain) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise complain(f"{show(value)} is not a mapping.", "a block of key: value lines")
    return dict(value)
