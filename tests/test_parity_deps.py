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


def test_with_dependencies_present_settings_are_built():
    settings = command._settings("32-true", 2, 1, "tiny", "cpu", [])
    assert settings.devices == 2 and settings.model == "tiny"
