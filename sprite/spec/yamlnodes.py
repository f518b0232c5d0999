"""PyYAML configured the way sprite reads YAML: bounded while composing, no implicit typing, one checked walk.

``compose(text, source)`` runs PyYAML's pure-Python reader, scanner, parser and composer with a hook that stops
past MAX_DEPTH levels of nesting or MAX_ALIASES alias uses, and a resolver that knows only null (every other
scalar stays the text written). ``build(node, source)`` turns the nodes into dicts, lists, strings and None,
counting values after alias expansion (MAX_NODES) and refusing recursive aliases, duplicate keys, keys that are
not plain text, tags other than ``!!str``, merge keys and control characters. PyYAML's C loader is not used: its
composer recurses in C, where no depth check can stop it. Every refusal is a SpecError naming file, line and key.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from yaml.composer import Composer
from yaml.events import AliasEvent
from yaml.nodes import MappingNode, ScalarNode, SequenceNode
from yaml.parser import Parser
from yaml.reader import Reader
from yaml.resolver import BaseResolver
from yaml.scanner import Scanner

from sprite.errors import SpecError, one_line, show

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
                raise limit_error(self.source, mark.line + 1, f"uses more than {MAX_ALIASES} aliases (*name).")
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise limit_error(self.source, mark.line + 1, f"nests deeper than {MAX_DEPTH} levels.")
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


def limit_error(source: str, line: int, what: str) -> SpecError:
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
            raise limit_error(self.source, node.start_mark.line + 1, f"expands to more than {MAX_NODES} values "
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


def compose(text: str, source: str):
    """The node graph of ``text`` (None for an empty document). Raises SpecError past a bound, yaml.YAMLError
    for bad syntax."""
    loader = _Loader(text, source)
    try:
        return loader.get_single_node()
    finally:
        loader.dispose()


def build(node, source: str) -> tuple[object, dict]:
    """``(data, lines)``: the plain value of ``node`` and the 1-based line of every key path. Raises SpecError."""
    builder = _Builder(source)
    return builder.build(node, ()), builder.lines
