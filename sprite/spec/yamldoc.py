"""The one way sprite reads YAML (job specs, site profiles): bounded, strict, and remembering every key's line.

``load(path)`` reads at most MAX_BYTES of a regular file (a FIFO or device is refused, never waited on), refuses
bytes that are not UTF-8 and NUL or other control characters with their line, and hands the text to
``sprite.spec.yamlnodes``: PyYAML's parser with bounds on nesting, aliases and expanded size, keys written once and
plain, no tags but ``!!str``, no merge keys.

Every scalar is the text as written (``010`` stays "010", ``yes`` stays "yes", ``1:30:00`` stays "1:30:00");
only an empty value, ``~`` and ``null`` are None. Each checker in ``sprite.values.grammar`` decides what its key means
(an integer parsed once with a range, ``true``/``false`` for a switch) and refuses anything else with the reason,
so YAML 1.1's implicit typing never surprises anyone.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import yaml

from sprite.errors import SpecError, UsageError, one_line, show
from sprite.spec.yamlnodes import CONTROL, MAX_BYTES, build, compose, limit_error
from sprite.values.env import kind_of

@dataclass
class YamlDoc:
    """A loaded YAML mapping plus the 1-based line of every key path, e.g. ``lines[("scheduler", "queue")]``."""

    source: str
    data: dict
    lines: dict[tuple, int] = field(default_factory=dict)

    def line(self, *path: str) -> int | None:
        """The line of ``path``, else of its nearest written parent, else None."""
        while path:
            if path in self.lines:
                return self.lines[path]
            path = path[:-1]
        return None

    def error(self, path: tuple, what: str, allowed: str = "") -> SpecError:
        """A SpecError pointing at ``path`` (a tuple of keys) in this document."""
        return SpecError(self.source, self.line(*path), ".".join(path), what, allowed)

    def where(self, path: tuple) -> str:
        """``file:line: key 'a.b'``: where ``path`` was written, for messages about a value found later."""
        line = self.line(*path)
        return f"{self.source}{f':{line}' if line else ''}: key '{'.'.join(path)}'"

    def complainer(self, section: tuple = ()) -> Callable[[str], Callable[..., SpecError]]:
        """``complainer(section)(key)(what, allowed)`` is the SpecError for ``key`` inside ``section``."""
        return lambda key: lambda what, allowed="": self.error((*section, key), what, allowed)

    def mapping(self, section: tuple = ()) -> dict:
        """The mapping at ``section`` ({} when absent or empty). Raises SpecError when it is not a mapping."""
        value = self.data
        for depth, key in enumerate(section):
            value = value.get(key)
            if value is None:  # absent, or written empty
                return {}
            if not isinstance(value, dict):
                raise self.error(section[:depth + 1], f"is {kind_of(value)}, not a mapping (its text not shown: "
                                 "it may hold a secret).", "a block of key: value lines")
        return value


def _syntax_error(err: yaml.YAMLError, text: str, source: str) -> SpecError:
    mark = getattr(err, "problem_mark", None)
    if mark is not None:
        line = mark.line + 1
    elif isinstance(err, yaml.reader.ReaderError):
        line = text.count("\n", 0, err.position) + 1
    else:
        line = None
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    return SpecError(source, line, "<syntax>", f"is not valid YAML ({one_line(problem, 200)}). An unclosed "
                     "bracket or quote, or a value with ': ' or ' #' left unquoted, is the usual cause; fix that line.")


def decode(data: bytes, source: str) -> str:
    """``data`` as text. Raises SpecError naming the line of the first byte that is not UTF-8, or of a NUL or
    other control character (tab and newline excepted)."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise SpecError(source, line, "<encoding>", f"byte {data[err.start]:#04x} is not UTF-8. The file was saved "
                        "in another encoding (Latin-1, UTF-16) or is not a text file.", "UTF-8 text") from None
    bad = CONTROL.search(text.replace("\r\n", "\n"))
    if bad:
        line = text.replace("\r\n", "\n").count("\n", 0, bad.start()) + 1
        raise SpecError(source, line, "<encoding>", f"holds the control character {bad.group()!r}. The file is "
                        "binary or was damaged.", "printable UTF-8 text") from None
    return text


def parse(text: str, source: str) -> YamlDoc:
    """Parse ``text`` into a YamlDoc (rules in the module docstring). Raises SpecError naming file, line and key."""
    if len(text.encode("utf-8", "surrogatepass")) > MAX_BYTES:
        raise limit_error(source, 1, f"is larger than {MAX_BYTES // 1024} KB.")
    try:
        node = compose(text, source)
    except yaml.YAMLError as err:
        raise _syntax_error(err, text, source) from None
    except RecursionError:  # the depth bound of yamlnodes should make this unreachable; kept as a last line
        raise limit_error(source, 1, "nests too deeply.") from None
    data, lines = build(node, source) if node is not None else (None, {})
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise SpecError(source, 1, "<top>", f"must be a mapping of keys to values, not a {type(data).__name__}.")
    return YamlDoc(source, data, lines)


def read_limited(path: Path, limit: int) -> bytes:
    """The bytes of the regular file ``path``, refusing one over ``limit`` bytes or not a regular file (a FIFO
    or device would block or never end). Raises UsageError."""
    try:
        # O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer; a regular file ignores it.
        with os.fdopen(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC), "rb") as handle:
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                raise UsageError(f"{show(str(path))} is not a regular file.", "A device, pipe or folder "
                                 "was named.", "Pass a YAML file.")
            data = handle.read(limit + 1)
    except PermissionError as err:
        raise UsageError(f"Cannot read {show(str(path))}: {err.strerror}.", "This user may not read the file.",
                         "Fix its permissions (chmod u+r) or pass a copy you may read.") from None
    except OSError as err:
        raise UsageError(f"Cannot read {show(str(path))}: {err.strerror}.",
                         "The path is wrong or relative to another folder.", "Pass an existing YAML file.") from None
    if len(data) > limit:
        raise limit_error(str(path), 1, f"is larger than {limit // 1024} KB.")
    return data


def load(path: str | Path) -> YamlDoc:
    """Read and parse a YAML file. Raises UsageError when it cannot be read, SpecError when it is not valid."""
    source = str(path)
    return parse(decode(read_limited(Path(path), MAX_BYTES), source), source)
