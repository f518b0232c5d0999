"""The one way sprite reads YAML (job specs, site profiles): bounded, strict, and remembering every key's line.

PyYAML's pure-Python reader, scanner and parser do the syntax; sprite adds three things around them:

- Bounds: at most MAX_BYTES of input, MAX_DEPTH levels of nesting (checked while composing, so a deep
  document never recurses further), MAX_ALIASES alias uses and MAX_NODES values after aliases are expanded (a
  670-byte alias bomb stops after MAX_NODES steps instead of growing to gigabytes).
- Strictness: UTF-8 only, no NUL or other control characters (raw or escaped), keys written once, keys are
  plain text, no tags but ``!!str``, no merge keys (``<<``).
- Text, not guesses: every scalar is the text as written (``010`` stays "010", ``yes`` stays "yes",
  ``1:30:00`` stays "1:30:00"); only an empty value, ``~`` and ``null`` are None. Each checker in
  ``sprite.values`` decides what its key means (an integer parsed once with a range, ``true``/``false`` for a
  switch) and refuses anything else with the reason, so YAML 1.1's implicit typing never surprises anyone.

There is no constructor: ``_Builder`` walks the composed nodes once, checking and building plain dicts, lists
and strings. PyYAML's C loader is not used: its composer recurses in C, where no depth check can stop it.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import yaml
from yaml.composer import Composer
from yaml.events import AliasEvent
from yaml.nodes import MappingNode, ScalarNode, SequenceNode
from yaml.parser import Parser
from yaml.reader import Reader
from yaml.resolver import BaseResolver
from yaml.scanner import Scanner

from sprite.errors import SpecError, UsageError, one_line, show

MAX_BYTES = 128 * 1024  # a spec or profile is a few KB; the pure-Python parser reads 128 KB in well under a second
MAX_DEPTH = 16  # specs nest three levels (scheduler: setup: [...]), profiles four (queues: debug: {...})
MAX_ALIASES = 100
MAX_NODES = 20_000  # values after alias expansion
STR, NULL = "tag:yaml.org,2002:str", "tag:yaml.org,2002:null"
TAGS = {STR, NULL, "tag:yaml.org,2002:seq", "tag:yaml.org,2002:map"}
CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # control characters other than tab and newline


class _Resolver(BaseResolver):
    """Resolves a plain scalar to null when it is empty, ``~`` or null, else to a string: no other guessing."""

    yaml_implicit_resolvers: dict = {}


_Resolver.add_implicit_resolver(NULL, re.compile(r"^(?:~|null|Null|NULL|)$"), ["~", "n", "N", ""])


class _Loader(Reader, Scanner, Parser, Composer, _Resolver):
    def __init__(self, text: str, source: str):
        Reader.__init__(self, text)
        Scanner.__init__(self)
        Parser.__init__(self)
        Composer.__init__(self)
        _Resolver.__init__(self)
        self.source, self.depth, self.aliases = source, 0, 0

    def compose_node(self, parent, index):
        mark = self.peek_event().start_mark
        if self.check_event(AliasEvent):
            self.aliases += 1
            if self.aliases > MAX_ALIASES:
                raise _limit(self.source, mark.line + 1, f"uses more than {MAX_ALIASES} aliases (*name).")
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise _limit(self.source, mark.line + 1, f"nests deeper than {MAX_DEPTH} levels.")
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


def _limit(source: str, line: int, what: str) -> SpecError:
    return SpecError(source, line, "<document>", what + " A generated or hostile file is the usual cause; a job "
                     "spec or site profile needs a few levels and no more than a handful of anchors.")


@dataclass
class _Builder:
    """Turns composed nodes into dicts, lists, strings and None, checking every node once."""

    source: str
    lines: dict = field(default_factory=dict)
    count: int = 0
    active: set = field(default_factory=set)

    def error(self, node, path: tuple, what: str, allowed: str = "") -> SpecError:
        return SpecError(self.source, node.start_mark.line + 1, ".".join(path) or "<top>", what, allowed)

    def build(self, node, path: tuple):
        self.count += 1
        if self.count > MAX_NODES:
            raise _limit(self.source, node.start_mark.line + 1, f"expands to more than {MAX_NODES} values "
                         "through its aliases.")
        if node.tag not in TAGS:
            raise self.error(node, path, f"has the tag {one_line(node.tag, 60)}; sprite reads plain values only.",
                             "values without tags (!!str is allowed)")
        if isinstance(node, ScalarNode):
            return self.scalar(node, path)
        if id(node) in self.active:
            raise self.error(node, path, "refers to itself through an alias (a recursive structure).")
        self.active.add(id(node))
        try:
            if isinstance(node, SequenceNode):
                return [self.build(item, path) for item in node.value]
            return self.mapping(node, path)
        finally:
            self.active.discard(id(node))

    def scalar(self, node: ScalarNode, path: tuple):
        if node.tag == NULL:
            return None
        bad = CONTROL.search(node.value)
        if bad:
            raise self.error(node, path, f"holds the control character {bad.group()!r} (written as an escape).",
                             "printable text; tabs and newlines only where a block of text belongs")
        return node.value

    def mapping(self, node: MappingNode, path: tuple) -> dict:
        out: dict = {}
        for key_node, value_node in node.value:
            key = self.key(key_node, path)
            here = (*path, key)
            if key in out:
                raise self.error(key_node, here, f"is written twice (first on line {self.lines[here]}); YAML "
                                 "would silently keep only the last one.", "each key once in its block")
            self.lines[here] = key_node.start_mark.line + 1
            out[key] = self.build(value_node, here)
        return out

    def key(self, node, path: tuple) -> str:
        if not isinstance(node, ScalarNode) or node.tag not in (STR, NULL):
            raise self.error(node, (*path, "<key>"), "is a list, mapping or tagged value used as a key.",
                             "a plain name as every key")
        if node.tag == NULL or CONTROL.search(node.value) or not node.value.strip():
            raise self.error(node, (*path, "<key>"), f"{show(node.value)} is an empty, null or non-printable key.",
                             "a plain name as every key")
        if node.value == "<<" and node.style is None:
            raise self.error(node, (*path, "<<"), "is a YAML merge key, which sprite does not read.",
                             "the keys written out in full")
        return node.value


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
                raise self.error(section[:depth + 1], f"{show(value)} is not a mapping.",
                                 "a block of key: value lines")
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
        raise _limit(source, 1, f"is larger than {MAX_BYTES // 1024} KB.")
    loader = _Loader(text, source)
    try:
        node = loader.get_single_node()
    except yaml.YAMLError as err:
        raise _syntax_error(err, text, source) from None
    except RecursionError:  # the depth bound above should make this unreachable; kept as a last line
        raise _limit(source, 1, "nests too deeply.") from None
    finally:
        loader.dispose()
    builder = _Builder(source)
    data = builder.build(node, ()) if node is not None else None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise SpecError(source, 1, "<top>", f"must be a mapping of keys to values, not a {type(data).__name__}.")
    return YamlDoc(source, data, builder.lines)


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
    except OSError as err:
        raise UsageError(f"Cannot read {show(str(path))}: {err.strerror}.",
                         "The path is wrong or relative to another folder.", "Pass an existing YAML file.") from None
    if len(data) > limit:
        raise _limit(str(path), 1, f"is larger than {limit // 1024} KB.")
    return data


def load(path: str | Path) -> YamlDoc:
    """Read and parse a YAML file. Raises UsageError when it cannot be read, SpecError when it is not valid."""
    source = str(path)
    return parse(decode(read_limited(Path(path), MAX_BYTES), source), source)
