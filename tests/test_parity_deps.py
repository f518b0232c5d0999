"""sprite parity refuses to start, with one usage line, when its optional LoRA dependencies are missing."""

from __future__ import annotations

import importlib.util

import pytest

from sprite.errors import UsageError
from sprite.parity.check import cli as command


def test_missing_peft_is_a_usage_error_before_anything_runs(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "peft" else real(name, *a))
    with pytest.raises(UsageError, match=r"needs peft, which is not installed.*sprite-hpc\[parity\]") as err:
        command._settings("32-true", 2, 1, "tiny", "cpu", [])
    assert err.value.exit_code == 2


def test_ckpt_check_without_peft_is_a_usage_error_too(monkeypatch):
    """README: sprite ckpt-check needs the parity extra as sprite parity and sprite bench do."""
    from sprite.parity.ckpt import cli as ckpt_command

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "peft" else real(name, *a))
    with pytest.raises(UsageError, match=r"sprite ckpt-check needs peft.*sprite-hpc\[parity\]") as err:
        ckpt_command.settings_from("32-true", 2, 1, "tiny", "cpu", 60)
    assert err.value.exit_code == 2


def test_with_dependencies_present_settings_are_built():
    settings = command._settings("32-true", 2, 1, "tiny", "cpu", [])
    assert settings.devices == 2 and settings.model == "tiny"


def test_ckpt_check_and_bench_do_not_import_the_parity_harness():
    """Shared pieces live at parity/ top level (recipe.Rows, launch, settings, progress, command); the harness
    subpackages import those, never each other."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "parity"
    found = []
    for package in ("ckpt", "bench", "check"):
        others = {f"sprite.parity.{name}" for name in ("ckpt", "bench", "check") if name != package}
        for path in sorted((root / package).glob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                    [node.module or ""] if isinstance(node, ast.ImportFrom) else []
                found += [f"{package}/{path.name}: {name}" for name in names
                          if any(name == o or name.startswith(o + ".") for o in others)]
    assert found == []
