"""The one YAML loading path (sprite/spec/yamldoc.py): bounded, strict, text as written, every key's line kept."""

from __future__ import annotations

import os
import time
import tracemalloc

import pytest

from sprite.spec import yamldoc
from sprite.errors import SpecError, UsageError


def refused(text: str, *fragments: str, line: int | None = None) -> SpecError:
    with pytest.raises(SpecError) as caught:
        yamldoc.parse(text, "job.yaml")
    message = str(caught.value)
    assert message.startswith("job.yaml") and "\n" not in message, message
    for fragment in fragments:
        assert fragment in message, message
    if line is not None:
        assert caught.value.line == line, message
    return caught.value


def alias_bomb(levels: int = 9) -> str:
    rows = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    rows += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, levels)]
    return "\n".join(rows) + "\n"


def test_an_alias_bomb_fails_fast_in_bounded_memory():
    bomb = alias_bomb()
    assert len(bomb) < 700  # 9**9 = 387 million strings once expanded
    tracemalloc.start()
    start = time.perf_counter()
    try:
        refused(bomb, "expands to more than 20000 values")
        elapsed, peak = time.perf_counter() - start, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert elapsed < 10 and peak < 50 * 2**20, (elapsed, peak)


def test_nesting_aliases_and_size_are_bounded():
    refused("a: " + "[" * 100_000 + "\n", "nests deeper than 16 levels", line=1)
    refused("a: &a x\n" + "".join(f"b{i}: *a\n" for i in range(101)), "more than 100 aliases", line=102)
    refused("a: " + "x" * (yamldoc.MAX_BYTES + 1) + "\n", "larger than 128 KB")
    refused("a: &a [1, *a]\n", "refers to itself", line=1)


@pytest.mark.parametrize("text, fragments, line", [
    ("scheduler: {account: a}\nscheduler: {walltime: '01:00:00'}\n", ("key 'scheduler'", "written twice",
                                                                        "first on line 1"), 2),
    ("env:\n  A: 1\n  A: 2\n", ("key 'env.A'", "written twice"), 3),
    ("scheduler: {null: x}\n", ("'null' is an empty, null", "scheduler.<key>"), 1),
    ("? [a, b]\n: x\n", ("used as a key",), 1),
    ('"\\x1b[31m": 1\n', ("'\\x1b[31m'",), 1),
    ("a: !!int 5\n", ("has the tag tag:yaml.org,2002:int",), 1),
    ("a: !!python/object:os.system x\n", ("has the tag",), 1),
    ('a: "x\\0y"\n', ("control character '\\x00'",), 1),
    ("<<: {a: 1}\n", ("merge key",), 1),
    ("- a\n", ("must be a mapping",), 1),
    ("a: b\n---\nc: d\n", ("not valid YAML",), 2),
])
def test_what_yaml_would_accept_silently_is_refused(text, fragments, line):
    refused(text, *fragments, line=line)


def test_scalars_are_the_text_as_written():
    doc = yamldoc.parse("a: 010\nb: yes\nc: 1:30:00\nd:\ne: ~\nf: 1e3\ng: '010'\nh: [1, true]\ni: !!str 7\n"
                        "'1': x\n", "job.yaml")
    assert doc.data == {"a": "010", "b": "yes", "c": "1:30:00", "d": None, "e": None, "f": "1e3", "g": "010",
                        "h": ["1", "true"], "i": "7", "1": "x"}
    assert doc.lines[("c",)] == 3 and doc.where(("h",)) == "job.yaml:8: key 'h'"


@pytest.mark.parametrize("data, fragment, line", [
    (b"a: 1\nb: \xff\xfe\n", "byte 0xff is not UTF-8", 2),
    (b"a: 1\n\nb: x\x00y\n", "control character '\\x00'", 3),
    (b"a: 1\rb: 2\n", "control character '\\r'", 1),
])
def test_bytes_that_are_not_text_name_their_line(tmp_path, data, fragment, line):
    path = tmp_path / "bad.yaml"
    path.write_bytes(data)
    with pytest.raises(SpecError) as caught:
        yamldoc.load(path)
    assert fragment in str(caught.value) and caught.value.line == line, str(caught.value)


def test_windows_line_ends_and_a_bom_are_fine(tmp_path):
    path = tmp_path / "crlf.yaml"
    path.write_bytes(b"\xef\xbb\xbfa: 1\r\nb: two\r\n")
    assert yamldoc.load(path).data == {"a": "1", "b": "two"}


def test_only_regular_files_are_read(tmp_path):
    fifo = tmp_path / "spec.fifo"
    os.mkfifo(fifo)
    start = time.perf_counter()
    for special in (fifo, "/dev/zero"):  # a FIFO without a writer would block a plain open(), /dev/zero never ends
        with pytest.raises(UsageError, match="not a regular file"):
            yamldoc.load(special)
    with pytest.raises(UsageError, match="Cannot read"):
        yamldoc.load(tmp_path / ("x" * 300))
    assert time.perf_counter() - start < 5
