"""README's test command splits the suite over two pytest-xdist workers by module, with every Slurm module on one."""

from __future__ import annotations

import pytest

import conftest


class _Item:
    def __init__(self, nodeid: str, fixtures: list[str]) -> None:
        self.nodeid, self.fixturenames = nodeid, fixtures


class _Config:
    def getvalue(self, name):
        return ["2*popen"] if name == "tx" else None


def test_every_slurm_module_is_one_scope_and_every_other_module_its_own():
    pytest.importorskip("xdist")
    scheduler = conftest.pytest_xdist_make_scheduler(_Config(), None)
    scopes = {scheduler._split_scope(f"{module}::test_x[a::b]") for module in conftest.SLURM_MODULES}
    assert scopes == {"slurm"}
    assert scheduler._split_scope("tests/test_ckpt_check.py::test_y[fp32]") == "tests/test_ckpt_check.py"
    assert scheduler._split_scope("tests/test_parity_runs.py::test_z") == "tests/test_parity_runs.py"


def test_a_module_that_uses_slurm_must_be_listed():
    conftest.pytest_collection_modifyitems(None, [_Item(f"{m}::t", ["slurm"]) for m in conftest.SLURM_MODULES])
    conftest.pytest_collection_modifyitems(None, [_Item("tests/test_new.py::t", ["tmp_path"])])
    with pytest.raises(pytest.UsageError, match="tests/test_new.py use.s. the slurm fixture"):
        conftest.pytest_collection_modifyitems(None, [_Item("tests/test_new.py::t", ["slurm", "tmp_path"])])
