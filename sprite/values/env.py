"""Checkers of a job's environment variables: ``env:`` (NAME: value) and ``pass_env:`` / ``secrets:`` (names).

Names are ASCII (what a job script can export); the variables sprite plans itself for every rank (the
rendezvous, the rank variables, ``SPRITE_*``) are refused, so a spec cannot silently lose to the plan. Values
are one-line text as written. Checkers follow ``sprite.values.grammar``: ``(value, complain)``.
"""

from __future__ import annotations

import fnmatch
import re
from typing import Any

from sprite import contract
from sprite.errors import Complain, show
from sprite.values.grammar import ENV_NAME, control_char, scalar_text

# Variables sprite plans itself for every rank (plan.environment): a spec's env: must not try to set them.
OWNED_ENV = (contract.MASTER_ADDR, contract.MASTER_PORT, "PYTHONSAFEPATH", *contract.RANK_VARS, *contract.ALL)
MASKED = "***"  # how every printer shows a value that may be a secret's (sprite.spec.secrets.MASK)
DEFAULT_PATTERNS = ("*_TOKEN", "*_KEY", "*SECRET*", "*PASSWORD*", "*_PAT")  # secret names, before a site's own
OWNED_HINT = {contract.MASTER_PORT: "--master-port or master_port:", contract.MASTER_ADDR: "--exclude to move it",
              contract.RUN_DIR: "--run-dir DIR to choose the run folder"}
# NAME=VALUE inside a shell line or a directive (export A=1, -v A=1,B=2, -vA=1, --export=ALL,A=1); VALUE up to a
# space, comma or semicolon, or a quoted string
_ASSIGNED = re.compile(r"(?<![A-Za-z0-9_$])([A-Za-z_][A-Za-z0-9_]*)=('[^']*'|\"[^\"]*\"|[^\s,;]*)")
_ATTACHED_V = re.compile(r"(^|\s)-v(?=[A-Za-z_])")  # qsub's -vNAME=VALUE: read as -v NAME=VALUE


def assignments(text: str) -> list[tuple[str, str]]:
    """``(NAME, VALUE)`` of every assignment in a shell line or a directive (``-vNAME=VALUE``, qsub's attached
    form, included)."""
    return _ASSIGNED.findall(_ATTACHED_V.sub(r"\1-v ", text))


def matching_pattern(name: str, patterns) -> str | None:
    """The first of ``patterns`` that ``name`` matches, compared in upper case (``wandb_api_key`` is a key too)."""
    return next((p for p in patterns if fnmatch.fnmatchcase(name.upper(), p.upper())), None)


def hide_values(text: str, patterns=DEFAULT_PATTERNS) -> str:
    """``text`` with the value of every ``NAME=VALUE`` whose NAME matches ``patterns`` shown as ``***``: for quoting
    a line of a spec in a message, where no site's own patterns are known yet."""
    return _ASSIGNED.sub(lambda m: f"{m[1]}={MASKED}" if matching_pattern(m[1], patterns) else m[0],
                         _ATTACHED_V.sub(r"\1-v ", text))


def _not_owned(name: str, complain: Complain) -> None:
    if name in OWNED_ENV or name.startswith("SPRITE_"):
        raise complain(f"{name} is set by sprite itself for every rank.", OWNED_HINT.get(
            name, "another name (sprite plans MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE and SPRITE_*)"))


def env(value: Any, complain: Complain) -> dict:
    """NAME: value pairs for every rank. Names are ASCII; the variables sprite plans itself are refused."""
    if not isinstance(value, dict):
        raise complain(f"is {kind_of(value)}, not a mapping (values not shown: one may be a secret's).",
                       "NAME: value pairs")
    out = {}
    for name, val in value.items():
        if not isinstance(name, str) or not ENV_NAME.fullmatch(name):
            shown = (f"{show(name.partition('=')[0])}={MASKED}" if isinstance(name, str) and "=" in name
                     else show(name))  # env: {HF_TOKEN=value}: a YAML key holding the value
            raise complain(f"{shown} is not a valid environment variable name.",
                           "ASCII letters, digits and _, not starting with a digit")
        _not_owned(name, complain)
        text = str(val).lower() if isinstance(val, bool) else scalar_text(val)
        if text is None and isinstance(val, float):
            text = repr(val)
        bad = control_char(text.replace("\t", " ")) if text is not None else None
        if text is None or bad:
            # The value is never shown: the name may be a secret's (the site's patterns are not known here).
            kind = f"holds the control character {bad!r}" if bad else f"is {kind_of(val)}"
            raise complain(f"{name}={MASKED}: the value {kind}, not one line of text.", "a string or number")
        out[name] = text
    return out


def kind_of(value: Any) -> str:
    """What ``value`` is, in words, without its text (a spec's value may hold a secret)."""
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return "text"
    return "a mapping" if isinstance(value, dict) else "empty" if value is None else f"a {type(value).__name__}"


def env_names(value: Any, complain: Complain) -> tuple[str, ...]:
    """Environment variable names (``secrets:``, ``pass_env:``): a list or a comma-separated string."""
    items = [part for part in value.split(",") if part] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(item, str) for item in items):
        what = kind_of(value) if not isinstance(value, list) else "a list holding " + ", ".join(
            dict.fromkeys(kind_of(item) for item in value if not isinstance(item, str)))
        raise complain(f"is {what}, not a list of variable names (values not shown: one may be a secret's).",
                       "a YAML list such as [HF_TOKEN, WANDB_API_KEY]")
    for item in items:
        name, given, _ = item.partition("=")
        if given and ENV_NAME.fullmatch(name):
            raise complain(f"{name}={MASKED} gives a value, and only names are listed here.", "a variable's NAME "
                           "alone: its value is read from the environment of the shell that runs sprite")
        if not ENV_NAME.fullmatch(item):
            shown = show(name) + ("=" + MASKED if given else "")
            raise complain(f"{shown} is not an environment variable name.", "ASCII letters, digits and _, "
                           "not starting with a digit")
        _not_owned(item, complain)
    return tuple(dict.fromkeys(items))
