"""The torch versions sprite is tested with: pyproject.toml states them, the installed torch lies inside them, and
every private torch name sprite still uses (sprite/runtime/ckpt/torch_names.py) exists in it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from sprite.runtime.ckpt import torch_names

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def _release(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.match(r"(\d+(?:\.\d+)*)", version).group(1).split("."))


def test_pyproject_states_the_tested_range():
    requirement = re.search(r'"torch([^"]*)"', PYPROJECT.read_text()).group(1)
    assert requirement == f">={torch_names.LOWEST},<{torch_names.BELOW}", requirement
    for version in torch_names.TESTED:
        assert _release(torch_names.LOWEST) <= _release(version) < _release(torch_names.BELOW), version


def test_the_installed_torch_is_one_sprite_is_tested_with():
    installed = _release(torch.__version__)
    assert _release(torch_names.LOWEST) <= installed < _release(torch_names.BELOW), (
        f"torch {torch.__version__} is outside the range sprite is tested with (>={torch_names.LOWEST},"
        f"<{torch_names.BELOW}, pyproject.toml). Install a torch in that range, or run sprite's checkpoint tests"
        f" with this one and widen the range in pyproject.toml and sprite/runtime/ckpt/torch_names.py.")


def test_every_private_name_sprite_uses_exists_in_the_installed_torch():
    assert not torch_names.missing(), (
        f"torch {torch.__version__} lacks {', '.join(torch_names.missing())}, which sprite uses (see"
        " sprite/runtime/ckpt/torch_names.py for where); adapt that use before widening the tested range.")


def test_the_save_path_names_no_private_torch_name():
    root = Path(torch_names.__file__).parent
    for name in ("save.py", "dcp_write.py", "seal.py", "durable.py", "stage.py", "background.py", "gcpause.py"):
        text = (root / name).read_text()
        found = re.findall(r"torch(?:\.\w+)*\._\w+|_get_default_store|_StorageInfo|_dtype_to_storage", text)
        assert not found, (name, found)


def test_torchs_checkpoint_process_logs_its_lines_on_the_root_logger_from_the_module_named():
    """dcp_write.quiet_checkpoint_process filters the root logger by torch_names.DCP_PROCESS_MODULE's file."""
    import importlib
    import logging

    module = importlib.import_module(torch_names.DCP_PROCESS_MODULE)
    assert module.logger is logging.getLogger(), (
        f"torch {torch.__version__}'s checkpoint process no longer logs on the root logger; "
        "dcp_write.quiet_checkpoint_process would let its per-save lines through")
