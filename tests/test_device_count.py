"""Devices torch will see, counted without torch, and the ranks `sprite run` starts without a scheduler.

No GPU exists here, so both vendors are faked, and named so: FakeSysfs builds /sys/class/drm of an Aurora node
(6 Intel GPU Max cards x 2 tiles, i915's cardN/gt/gtM layout) in a temp folder, and tests/fakes/
nvidia_smi_two_gpus answers `nvidia-smi -L` as a 2-GPU box would.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from sprite.errors import UsageError
from sprite.launch import devicecount
from sprite.cli import envinfo
from sprite.launch.plan import plan_run

FAKES = Path(__file__).parent / "fakes"


class FakeSysfs:
    """A fake /sys: Intel cards (vendor 0x8086) with tiles, plus decoys sprite must not count."""

    def __init__(self, root: Path, tiles: list[int], layout: str = "i915"):
        drm = root / "class" / "drm"
        for index, count in enumerate(tiles):
            card = drm / f"card{index}"
            (card / "device").mkdir(parents=True)
            (card / "device" / "vendor").write_text("0x8086\n")
            for tile in range(count):
                (card / "gt" / f"gt{tile}" if layout == "i915" else card / "device" / f"tile{tile}").mkdir(parents=True)
        (drm / "card0-DP-1").mkdir(parents=True)  # a connector, not a card
        other = drm / f"card{len(tiles)}" / "device"
        other.mkdir(parents=True)
        (other / "vendor").write_text("0x1a03\n")  # the node's BMC graphics (ASPEED)
        self.root = root


@pytest.fixture
def aurora_sysfs(tmp_path) -> Path:
    return FakeSysfs(tmp_path / "sys", [2] * 6).root


@pytest.mark.parametrize("environ, expected", [
    ({}, 12),  # Level Zero's default hierarchy is FLAT: every tile a device
    ({"ZE_FLAT_DEVICE_HIERARCHY": "FLAT"}, 12),
    ({"ZE_FLAT_DEVICE_HIERARCHY": "COMBINED"}, 12),  # SYCL, and so torch.xpu, still sees tiles
    ({"ZE_FLAT_DEVICE_HIERARCHY": "COMPOSITE"}, 6),
    ({"ZE_AFFINITY_MASK": "0,1"}, 2),
    ({"ZE_AFFINITY_MASK": "0,1,11,12"}, 3),  # 12 is past the last tile and ignored
    ({"ZE_FLAT_DEVICE_HIERARCHY": "COMPOSITE", "ZE_AFFINITY_MASK": "0,1"}, 2),
    ({"ZE_FLAT_DEVICE_HIERARCHY": "COMPOSITE", "ZE_AFFINITY_MASK": "0.0,1.0"}, 2),
    ({"ZE_FLAT_DEVICE_HIERARCHY": "COMPOSITE", "ZE_AFFINITY_MASK": "0.0,0.1"}, 1),  # one card, both tiles
])
def test_aurora_node_counts_as_torch_sees_it(aurora_sysfs, environ, expected):
    env = {"PATH": "/nonexistent", **environ}  # no nvidia-smi
    assert devicecount.visible(env, aurora_sysfs) == ("xpu", expected)


def test_xe_driver_layout_and_no_gpu(tmp_path):
    xe = FakeSysfs(tmp_path / "xe", [2, 2], layout="xe").root
    assert devicecount.visible({"PATH": "/nonexistent"}, xe) == ("xpu", 4)
    assert devicecount.visible({"PATH": "/nonexistent"}, tmp_path / "empty") == ("cpu", 0)


def test_sprite_env_shows_the_count_torch_will_see(aurora_sysfs):
    env = {"PATH": "/nonexistent", "ZE_FLAT_DEVICE_HIERARCHY": "FLAT"}
    info = envinfo.detect("aurora", env, sysfs=aurora_sysfs)
    assert info["devices_here"] == {"type": "xpu", "count": 12} and info["backend"] == "xccl"
    assert "devices here 12 x xpu" in envinfo.describe(info)
    info = envinfo.detect("local", {**env, "ZE_FLAT_DEVICE_HIERARCHY": "COMPOSITE"}, sysfs=aurora_sysfs)
    assert info["devices_here"]["count"] == 6 and info["ranks_per_node"] == 6


@pytest.fixture
def two_gpu_path(tmp_path, clean_env) -> dict:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shutil.copy(FAKES / "nvidia_smi_two_gpus", bin_dir / "nvidia-smi")
    return {**clean_env, "PATH": f"{bin_dir}{os.pathsep}{clean_env['PATH']}"}


@pytest.mark.parametrize("extra, visible", [({}, 2), ({"CUDA_VISIBLE_DEVICES": "1"}, 1),
                                            ({"CUDA_VISIBLE_DEVICES": "0,7,1"}, 1), ({"CUDA_VISIBLE_DEVICES": ""}, 0)])
def test_cuda_visible_devices_narrows_the_gpus(two_gpu_path, extra, visible):
    assert devicecount.nvidia_gpus({**two_gpu_path, **extra}) == visible


def test_run_starts_one_rank_per_visible_gpu_without_a_scheduler(two_gpu_path, example_script):
    launch = plan_run({"script": example_script}, two_gpu_path)
    assert launch.argv[3:5] == ["--nproc", "2"] and launch.env["SPRITE_DEVICES"] == "2"
    assert plan_run({"script": example_script, "accelerator": "cpu"}, two_gpu_path).world.devices == 1
    assert plan_run({"script": example_script, "devices": 3, "accelerator": "cpu"}, two_gpu_path).world.devices == 3


@pytest.mark.parametrize("flags, extra, build", [
    ({"devices": 3}, {}, "cuda"), ({"devices": 3, "accelerator": "cuda"}, {}, "cpu"),
    ({"devices": 3, "accelerator": "cuda"}, {}, ""), ({"devices": 2}, {"CUDA_VISIBLE_DEVICES": "1"}, "cuda")])
def test_more_ranks_than_the_gpus_here_are_refused_before_anything_runs(two_gpu_path, example_script, monkeypatch,
                                                                          flags, extra, build):
    """On a 1-GPU H200 host `sprite parity --precision bf16-mixed` (2 ranks, accelerator auto, torch built for
    CUDA) ran four arms, then failed in the DDP arm; now the plan refuses it. An explicit --accelerator cuda is
    checked whatever torch says."""
    monkeypatch.setattr(devicecount, "torch_build", lambda: build)
    with pytest.raises(UsageError) as refused:
        plan_run({"script": example_script, **flags}, {**two_gpu_path, **extra})
    shown = 2 if not extra else 1
    assert str(refused.value).startswith(f"--devices {flags['devices']} puts {flags['devices']} ranks on this "
                                         f"machine, which shows {shown} cuda device(s).")
    assert f"--devices {shown} or fewer" in str(refused.value)


@pytest.mark.parametrize("build", ["cpu", ""])
def test_auto_with_a_torch_not_built_for_cuda_is_not_refused(two_gpu_path, example_script, monkeypatch, build):
    """A laptop with an NVIDIA GPU and a CPU build of torch (the README's install): auto gives CPU ranks, so the
    front page's `sprite run --devices 2` must still plan there. A torch without a label is not known either way."""
    monkeypatch.setattr(devicecount, "torch_build", lambda: build)
    assert plan_run({"script": example_script, "devices": 3}, two_gpu_path).world.devices == 3


@pytest.mark.parametrize("version, build", [("2.11.0+cu130", "cuda"), ("2.13.0+cpu", "cpu"), ("2.8.0+xpu", "xpu"),
                                            ("2.5.1+rocm6.2", "cuda"), ("2.13.0", ""), (None, "")])
def test_the_torch_build_is_read_from_its_version_label(monkeypatch, version, build):
    from importlib import metadata

    def fake(name):
        if version is None:
            raise metadata.PackageNotFoundError(name)
        return version

    monkeypatch.setattr(metadata, "version", fake)
    monkeypatch.setattr(devicecount, "_build_from_version_file", lambda: "")
    assert devicecount.torch_build() == build


VERSION_PY = """from typing import Optional

__all__ = ['__version__', 'debug', 'cuda', 'git_version', 'hip', 'rocm', 'xpu']
__version__ = '{version}'
debug = False
cuda: Optional[str] = {cuda}
git_version = 'cf30153c4c131c8164ee7798e5022d810682e2cb'
hip: Optional[str] = {hip}
xpu: Optional[str] = {xpu}
"""


@pytest.mark.parametrize("cuda, hip, xpu, build", [
    ("'13.0'", "None", "None", "cuda"), ("None", "'6.2.41133'", "None", "cuda"), ("None", "None", "'20250101'", "xpu"),
    ("None", "None", "None", "cpu")])
def test_the_torch_build_is_read_from_torch_version_py(tmp_path, cuda, hip, xpu, build):
    version_py = tmp_path / "version.py"
    version_py.write_text(VERSION_PY.format(version="2.11.0", cuda=cuda, hip=hip, xpu=xpu))
    assert devicecount._build_from_version_file(version_py) == build


@pytest.mark.parametrize("text", ["", "def broken(:\n", "x = 1\n", "\udcff"])
def test_a_version_py_that_is_not_torch_s_tells_nothing(tmp_path, text):
    version_py = tmp_path / "version.py"
    version_py.write_text(text, errors="surrogateescape")
    assert devicecount._build_from_version_file(version_py) == ""
    assert devicecount._build_from_version_file(tmp_path / "missing.py") == ""


def test_a_cuda_torch_without_a_label_in_its_metadata_is_a_cuda_build(tmp_path, monkeypatch):
    """The H200 image: the metadata says 2.11.0, torch.__version__ says 2.11.0+cu130. The label alone missed it,
    and `sprite parity` as typed started two ranks on the one GPU (docs/runs/h200-2026-12-03-d)."""
    from importlib import metadata, util

    package = tmp_path / "torch"
    package.mkdir()
    (package / "__init__.py").write_text("raise RuntimeError('imported')\n")
    (package / "version.py").write_text(VERSION_PY.format(version="2.11.0+cu130", cuda="'13.0'", hip="None",
                                                          xpu="None"))
    monkeypatch.setattr(metadata, "version", lambda name: "2.11.0")
    real = util.find_spec
    monkeypatch.setattr(util, "find_spec",
                        lambda name, *a: util.spec_from_file_location("torch", package / "__init__.py")
                        if name == "torch" else real(name, *a))
    assert devicecount.torch_build() == "cuda"


def test_the_installed_torch_is_read_without_importing_it():
    import subprocess
    import sys

    code = ("import sys; from sprite.launch import devicecount; b = devicecount.torch_build(); "
            "print(b, 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    import torch

    want = "cuda" if (torch.version.cuda or torch.version.hip) else "xpu" if getattr(torch.version, "xpu", None) \
        else "cpu"
    assert out == [want, "False"]


def test_inside_an_allocation_the_gpus_of_the_planning_node_are_not_counted(two_gpu_path, example_script, tmp_path):
    (tmp_path / "nodefile").write_text("127.0.0.1\n")
    env = {**two_gpu_path, "PBS_JOBID": "1.test", "PBS_NODEFILE": str(tmp_path / "nodefile")}
    assert plan_run({"script": example_script, "devices": 3}, env).world.devices == 3


def test_cpu_only_machine_stays_one_rank(clean_env, example_script):
    env = {**clean_env, "PATH": str(Path(clean_env["PATH"].split(os.pathsep)[0]))}  # the venv: no nvidia-smi
    if devicecount.intel_cards():
        pytest.skip("this machine has an Intel GPU in /sys/class/drm")
    assert devicecount.nvidia_gpus(env) == 0
    assert plan_run({"script": example_script}, env).world.devices == 1


@pytest.mark.parametrize("check", [["parity", "--precision", "bf16-mixed"], ["ckpt-check"]])
def test_a_check_refused_on_a_one_gpu_machine_does_not_suggest_one_rank(two_gpu_path, tmp_path, sprite_cmd, check):
    """parity and ckpt-check need 2 ranks, so the refusal names the CPU and a larger machine, not --devices 1
    (which the check itself would then refuse), and makes nothing."""
    import subprocess

    work = tmp_path / "work"
    work.mkdir()
    # a FAKE CUDA build of torch for the planning process, which reads torch/version.py and never imports torch
    # (without it the check refuses this machine's CPU build first: parity/usage.check_build)
    fake = tmp_path / "fake_torch" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('a fake torch for planning only')\n")
    (fake / "version.py").write_text("cuda = '13.0'\nhip = None\n")
    env = {**two_gpu_path, "CUDA_VISIBLE_DEVICES": "1", "PYTHONPATH": str(fake.parent)}
    done = subprocess.run([*sprite_cmd, *check, "--accelerator", "cuda"], cwd=work, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "--devices 2 puts 2 ranks on this machine, which shows 1 cuda device(s)." in done.stderr
    assert done.stderr.rstrip().endswith("Use --accelerator cpu for CPU ranks, a machine with 2 cuda devices.")
    assert list(work.iterdir()) == []


def test_sprite_run_still_suggests_fewer_devices(two_gpu_path, example_script):
    with pytest.raises(UsageError, match=r"or --devices 1 or fewer\.$"):
        plan_run({"script": example_script, "devices": 2, "accelerator": "cuda"},
                 {**two_gpu_path, "CUDA_VISIBLE_DEVICES": "1"})
