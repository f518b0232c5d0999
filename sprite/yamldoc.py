"""YAML loading that remembers where each key was written, so rejections can name file, line and key."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import yaml

from sprite.errors import SpecError, UsageError


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

    def complainer(self, section: tuple = ()) -> Callable[[str], Callable[..., SpecError]]:
        """``complainer(section)(key)(what, allowed)`` is the SpecError for ``key`` inside ``section``."""
        return lambda key: lambda what, allowed="": self.error((*section, key), what, allowed)

    def mapping(self, section: tuple = ()) -> dict:
        """The mapping at ``section`` ({} when absent or empty). Raises SpecError when it is not a mapping."""
        value = self.data
        for depth, key in enumerate(section):
            value = value.get(key) or {}
            if not isinstance(value, dict):
                raise self.error(section[:depth + 1], f"{value!r} is not a mapping.", "a block of key: value lines")
        return value


def _walk(node: yaml.Node, prefix: tuple, lines: dict) -> None:
    if not isinstance(node, yaml.MappingNode):
        return
    for key_node, value_node in node.value:
        path = (*prefix, str(key_node.value))
        lines[path] = key_node.start_mark.line + 1
        _walk(value_node, path, lines)


def parse(text: str, source: str) -> YamlDoc:
    """Parse ``text`` (safe loader only). Raises SpecError for bad syntax or a top level that is not a mapping."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line = mark.line + 1 if mark else None
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise SpecError(source, line, "<syntax>", f"is not valid YAML ({problem}). An unclosed bracket or quote,"
                        " or a value with ': ' or ' #' left unquoted, is the usual cause; fix that line.") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise SpecError(source, 1, "<top>", f"must be a mapping of keys to values, not a {type(data).__name__}.")
    lines: dict[tuple, int] = {}
    if node is not None:
        _walk(node, (), lines)
    return YamlDoc(source, data, lines)


def load(path: str | Path) -> YamlDoc:
    """Read and parse a YAML file. Raises UsageError when it cannot be read, SpecError when it is not valid."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as err:
        raise UsageError(
            f"Cannot read {path}: {err.strerror}.",
            "The path is wrong or relative to another folder.",
            "Pass an existing YAML file.",
        ) from None
    return parse(text, str(path))
