"""Every value checker of a job spec, a site profile and a spec's ``scheduler:`` block, in one place.

Each checker takes the raw YAML (or flag) value and ``complain(what, allowed)`` and returns the clean value or
raises what ``complain`` builds (a SpecError naming file, line and key, or a UsageError naming the flag).

Every value that reaches a ``#PBS``/``#SBATCH`` directive must be a plain token (letters, digits and
``_ . , : = @ % + / -``): qsub and sbatch read directives with their own parsers, not the shell's, so no
quoting can make a space, quote or ``$`` safe there. Setup lines are single commands split into words; each
word is shell-quoted when rendered, so shell syntax in them is refused rather than silently made literal.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

from sprite.errors import Complain, UsageError

TOKEN = re.compile(r"[A-Za-z0-9_.,:=@%+/-]+")
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
WALLTIME = re.compile(r"(\d{1,3}):([0-5]\d):([0-5]\d)")
SIGNAL = re.compile(r"(?:SIG)?(USR1|USR2|TERM|INT|HUP|URG|CONT)@(\d{1,5})")
PLACE = re.compile(r"(free|pack|scatter|vscatter|excl|shared|exclhost)(:(excl|shared|exclhost|group=[a-z]+))*")
SHELL_SYNTAX = re.compile(r"[$`;&|<>(){}\\!*?\[\]~#]")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
TOKEN_ALLOWED = "letters, digits and _ . , : = @ % + / - (no spaces, quotes, $ or control characters)"


def control_char(text: str) -> str | None:
    """The first newline or other control character in ``text``, else None."""
    return next((ch for ch in text if ord(ch) < 32 or ord(ch) == 127), None)


def token(value: Any, complain: Complain) -> str:
    """A directive-safe token. Raises ``complain(...)`` for anything else."""
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise complain(f"{value!r} is not a string.", TOKEN_ALLOWED)
    text = str(value)
    if not TOKEN.fullmatch(text):
        raise complain(f"{text!r} cannot be written safely into a #PBS/#SBATCH directive.", TOKEN_ALLOWED)
    return text


def name(value: Any, complain: Complain) -> str:
    text = token(value, complain)
    if not NAME.fullmatch(text):
        raise complain(f"{text!r} is not a plain name.", "letters, digits, _ . - (starting with a letter or digit)")
    return text


def walltime(value: Any, complain: Complain) -> str:
    text = str(value) if isinstance(value, str) else ""
    if not WALLTIME.fullmatch(text):
        raise complain(f"{value!r} is not a walltime in HH:MM:SS (YAML reads unquoted 1:30:00 as a number).",
                       'a quoted "HH:MM:SS" with minutes and seconds below 60, e.g. "01:00:00"')
    return text


def seconds(walltime_text: str) -> int:
    hours, minutes, secs = (int(part) for part in walltime_text.split(":"))
    return hours * 3600 + minutes * 60 + secs


def count(value: Any, complain: Complain) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise complain(f"{value!r} is not a whole number of at least 1.", "an integer such as 2")
    return value


def flag(value: Any, complain: Complain) -> bool:
    if not isinstance(value, bool):
        raise complain(f"{value!r} is not true or false.", "true or false")
    return value


def names(value: Any, complain: Complain) -> tuple[str, ...]:
    """A list (or ``a:b`` string) of plain names, e.g. filesystems ``[home, flare]``."""
    items = value.split(":") if isinstance(value, str) else value
    if not isinstance(items, list) or not items:
        raise complain(f"{value!r} is not a list of names.", "a YAML list such as [home, flare]")
    return tuple(name(item, complain) for item in items)


def place(value: Any, complain: Complain) -> str:
    text = token(value, complain)
    if not PLACE.fullmatch(text):
        raise complain(f"{text!r} is not a PBS placement.", "free, pack or scatter, optionally :excl, :shared, "
                       ":exclhost or :group=<resource>, e.g. scatter or scatter:excl")
    return text


def dependency(value: Any, complain: Complain) -> tuple[str, ...]:
    """Job ids that must finish successfully first (afterok). ``afterok:1:2`` or a list of ids."""
    if isinstance(value, str) and value.startswith("afterok:"):
        value = value[len("afterok:"):].split(":")
    items = value if isinstance(value, list) else [value]
    return tuple(name(item, lambda what, allowed: complain(
        what, "afterok:<job id>[:<job id>...] or a list of job ids, e.g. afterok:123456")) for item in items)


def preempt_signal(value: Any, complain: Complain) -> tuple[str, int]:
    match = SIGNAL.fullmatch(str(value)) if isinstance(value, str) else None
    if not match or int(match.group(2)) < 1:
        raise complain(f"{value!r} is not SIGNAL@SECONDS.", "USR1, USR2, TERM, INT, HUP, URG or CONT, then @ and the "
                       "seconds before the walltime ends, e.g. USR1@90")
    return match.group(1), int(match.group(2))


def directives(value: Any, complain: Complain) -> tuple[str, ...]:
    """Extra directive options such as ``-l debug=true`` or ``--mail-type=END``, each word a safe token."""
    items = value if isinstance(value, list) else None
    if items is None or not all(isinstance(item, str) for item in items):
        raise complain(f"{value!r} is not a list of strings.", 'a YAML list such as ["--mail-type=END"]')
    for item in items:
        words = item.split(" ")
        if not item.startswith("-") or not all(words):
            raise complain(f"{item!r} is not a directive option.", "an option starting with -, words separated "
                           "by single spaces, e.g. -l debug=true")
        for word in words:
            token(word, complain)
    return tuple(items)


def setup(value: Any, complain: Complain) -> tuple[tuple[str, ...], ...]:
    """Environment set-up commands (``module load frameworks``), each split into words like a shell would."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(item, str) for item in items):
        raise complain(f"{value!r} is not a list of commands.", 'a YAML list such as ["module load frameworks"]')
    out = []
    for item in items:
        if control_char(item) or SHELL_SYNTAX.search(item):
            raise complain(f"{item!r} holds shell syntax or control characters; setup lines are single commands "
                           "whose words are passed literally.", "a command and plain arguments such as module "
                           "load frameworks; put shell code in a file and use: source /path/to/file.sh")
        out.append(tuple(shlex.split(item)))
    return tuple(words for words in out if words)


def choice(options: tuple[str, ...]):
    """A checker accepting exactly one of ``options``."""
    def check(value: Any, complain: Complain) -> str:
        text = str(value) if isinstance(value, (str, int)) and not isinstance(value, bool) else None
        if text not in options:
            raise complain(f"{value!r} is not a valid choice.", ", ".join(options))
        return text
    return check


def switch(options: tuple[str, ...]):
    """``choice(options)`` for options that start with "on" and "off", which a bare YAML on/off (or yes/no,
    true/false) reaches as a boolean under yaml.safe_load (YAML 1.1)."""
    plain = choice(options)

    def check(value: Any, complain: Complain) -> str:
        return options[0 if value else 1] if isinstance(value, bool) else plain(value, complain)
    return check


def positive_int(value: Any, complain: Complain) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)) or not str(value).strip().isdigit():
        raise complain(f"{value!r} is not a whole number.", "an integer of at least 1, e.g. 2")
    if int(value) < 1:
        raise complain(f"{value!r} is less than 1.", "an integer of at least 1")
    return int(value)


def non_negative_int(value: Any, complain: Complain) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)) or not str(value).strip().isdigit():
        raise complain(f"{value!r} is not a whole number.", "an integer of at least 0, e.g. 1")
    return int(value)


def duration(value: Any, complain: Complain) -> float:
    """Seconds, a positive finite number (an int, a float or their text)."""
    try:
        number = float(value) if isinstance(value, (int, float, str)) and not isinstance(value, bool) else None
    except ValueError:
        number = None
    if number is None or not 0 < number < float("inf"):
        raise complain(f"{value!r} is not a positive number of seconds.", "seconds above 0, e.g. 600")
    return number


def port(value: Any, complain: Complain) -> int:
    number = positive_int(value, complain)
    if not 1024 <= number <= 65535:
        raise complain(f"{number} is outside the unprivileged port range.", "1024-65535")
    return number


def string(value: Any, complain: Complain) -> str:
    if not isinstance(value, str) or not value:
        raise complain(f"{value!r} is not a non-empty string.", "a path or name in quotes if need be")
    return value


def string_list(value: Any, complain: Complain) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [part for part in value.split(",") if part]
    if not isinstance(value, list) or not all(isinstance(v, (str, int, float)) for v in value):
        raise complain(f"{value!r} is not a list of strings.", "a YAML list such as [a, b]")
    return tuple(str(v) for v in value)


def env(value: Any, complain: Complain) -> dict:
    if not isinstance(value, dict):
        raise complain(f"{value!r} is not a mapping.", "NAME: value pairs")
    out = {}
    for name, val in value.items():
        if not isinstance(name, str) or not name.replace("_", "a").isalnum() or name[0].isdigit():
            raise complain(f"{name!r} is not a valid environment variable name.", "letters, digits and _")
        if isinstance(val, (dict, list)) or val is None:
            raise complain(f"{name}={val!r} is not a scalar value.", "a string or number")
        out[name] = str(val).lower() if isinstance(val, bool) else str(val)
    return out


def env_names(value: Any, complain: Complain) -> tuple[str, ...]:
    """Environment variable names (``secrets:``, ``pass_env:``): a list or a comma-separated string."""
    items = [part for part in value.split(",") if part] if isinstance(value, str) else value
    if not isinstance(items, list) or not all(isinstance(item, str) for item in items):
        raise complain(f"{value!r} is not a list of variable names.", "a YAML list such as [HF_TOKEN, WANDB_API_KEY]")
    for item in items:
        if not ENV_NAME.fullmatch(item):
            raise complain(f"{item!r} is not an environment variable name.", "ASCII letters, digits and _, "
                           "not starting with a digit")
    return tuple(dict.fromkeys(items))


def resume(value: Any, complain: Complain) -> str:
    if not isinstance(value, str) or not value.strip():
        raise complain(f"{value!r} is not never, auto or a checkpoint path.", "never, auto, or a checkpoint path")
    return value.strip()


def mapping(value: Any, complain: Complain) -> dict:
    if not isinstance(value, dict):
        raise complain(f"{value!r} is not a mapping.", "a block of key: value lines")
    return dict(value)


def directive_word(key: str, value) -> str:
    """``value`` as directive text that needs no quoting. Raises UsageError naming ``key`` otherwise.

    Values were checked to be directive-safe tokens when the block was validated; here each is still passed
    through ``shlex.quote`` and must come back unchanged, so a token that would need quoting can never reach a
    directive even if a caller skipped validation.
    """
    text = str(value)
    if shlex.quote(text) != text or not text:
        raise UsageError(
            f"scheduler.{key} = {text!r} cannot be written into a job-script directive.",
            "qsub and sbatch read directives with their own parsers, so quoting cannot protect spaces, "
            "quotes, $ or control characters there.",
            "Use letters, digits and _ . , : = @ % + / - only.",
        )
    return text


def directive_words(item: str) -> str:
    """An ``extra`` directive option, every space-separated word checked by ``directive_word``."""
    return " ".join(directive_word("extra", word) for word in item.split(" "))
