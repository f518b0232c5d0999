"""XPU code paths on a machine without XPUs: ``torch.xpu`` is swapped for FakeXPUModule, a named fake."""

from __future__ import annotations

import pytest
import torch
from lightning.pytorch.plugins.precision import HalfPrecision, Precision
from lightning.pytorch.strategies import SingleDeviceStrategy

import sprite
from sprite.errors import SpriteError, UsageError
from sprite.runtime import ddp as ddp_module
from sprite.runtime.devices import backend_for, device_type
from sprite.runtime.precision import precision_plugin


class FakeXPUModule:
    """Stands in for ``torch.xpu`` with ``count`` visible tiles; records set_device calls."""

    def __init__(self, count: int = 4, available: bool = True, current: int = 0):
        self.count, self.available, self.current, self.selected = count, available, current, []

    def is_available(self):
        return self.available

    def device_count(self):
        return self.count if self.available else 0

    def set_device(self, index):
        self.selected.append(index)

    def current_device(self):
        return self.current

    def memory_stats(self, device=None):
        return {"allocated_bytes.all.current": 0}

    def empty_cache(self):
        pass


@pytest.fixture
def fake_xpu(monkeypatch):
    fake = FakeXPUModule(count=4, current=2)
    monkeypatch.setattr(torch, "xpu", fake)
    return fake


def test_public_names_import_from_sprite():
    names = ("trainer_kwargs", "shard_model", "XPUAccelerator", "XPUMixedPrecision", "XPUDDPStrategy",
             "FSDP2Strategy", "PALSEnvironment")
    assert all(callable(getattr(sprite, name)) for name in names)


def test_device_table_rows(fake_xpu):
    assert device_type("auto").name == "xpu"
    assert [backend_for(torch.device(t)) for t in ("xpu", "cuda", "cpu")] == ["xccl", "nccl", "gloo"]
    assert device_type("gpu").name == "cuda" and device_type("cpu").autocast == "cpu"
    fake_xpu.available = False
    assert device_type("auto").name in ("cuda", "cpu")
    with pytest.raises(UsageError, match="Unknown accelerator 'tpu'"):
        device_type("tpu")


def test_accelerator_selects_the_local_rank_tile(fake_xpu):
    sprite.XPUAccelerator().setup_device(torch.device("xpu", 3))
    assert fake_xpu.selected == [3]
    assert sprite.XPUAccelerator.get_parallel_devices(2) == [torch.device("xpu", 0), torch.device("xpu", 1)]
    assert sprite.XPUAccelerator.parse_devices([3]) == [3]
    assert sprite.XPUAccelerator.parse_devices("0,2") == [0, 2]
    assert sprite.XPUAccelerator.parse_devices(-1) == [0, 1, 2, 3]


def test_accelerator_refuses_a_tile_it_cannot_see(fake_xpu):
    fake_xpu.count = 1  # what a per-rank ZE_AFFINITY_MASK leaves each rank
    with pytest.raises(SpriteError) as err:
        sprite.XPUAccelerator().setup_device(torch.device("xpu", 7))
    assert "sees 1 XPU device(s) but was assigned xpu:7" in str(err.value)
    assert "ZE_AFFINITY_MASK" in str(err.value) and fake_xpu.selected == []


def test_trainer_kwargs_on_xpu(fake_xpu):
    kwargs = sprite.trainer_kwargs("ddp", devices=12, num_nodes=2, accelerator="xpu")
    assert isinstance(kwargs["accelerator"], sprite.XPUAccelerator)
    assert isinstance(kwargs["strategy"], sprite.XPUDDPStrategy)
    assert (kwargs["devices"], kwargs["num_nodes"]) == (12, 2)
    (plugin,) = kwargs["plugins"]
    assert isinstance(plugin, sprite.XPUMixedPrecision) and plugin.device == "xpu"
    assert plugin.precision == "bf16-mixed"
    assert isinstance(sprite.trainer_kwargs("fsdp", accelerator="xpu")["strategy"], sprite.FSDP2Strategy)


def test_single_pins_the_requested_tile(fake_xpu):
    pinned = sprite.trainer_kwargs("single", devices=[3], accelerator="xpu")
    assert isinstance(pinned["strategy"], SingleDeviceStrategy)
    assert pinned["strategy"].root_device == torch.device("xpu", 3) and pinned["devices"] == 1
    current = sprite.trainer_kwargs("single", devices="auto", accelerator="xpu")["strategy"]
    assert current.root_device == torch.device("xpu", 2)  # the fake's current device
    with pytest.raises(UsageError, match="devices=2"):
        sprite.trainer_kwargs("single", devices=2, accelerator="xpu")


def test_ddp_wraps_without_cuda_stream_and_uses_xccl(fake_xpu, monkeypatch):
    def no_cuda(*args, **kwargs):
        raise AssertionError("torch.cuda.stream called on an XPU run")

    seen = {}
    monkeypatch.setattr(torch.cuda, "stream", no_cuda)
    monkeypatch.setattr(ddp_module, "DistributedDataParallel", lambda **kw: seen.update(kw) or "wrapped")
    strategy = sprite.XPUDDPStrategy(parallel_devices=[torch.device("xpu", 0), torch.device("xpu", 1)])
    assert strategy._get_process_group_backend() == "xccl"
    assert strategy._setup_model(torch.nn.Linear(2, 2)) == "wrapped" and seen["device_ids"] == [0]


def test_fsdp2_backend_from_the_table(fake_xpu):
    strategy = sprite.FSDP2Strategy()
    strategy.parallel_devices = [torch.device("xpu", 0)]
    assert strategy._get_process_group_backend() == "xccl"


@pytest.mark.parametrize("given, name", [("bf16-mixed", "bf16-mixed"), ("bf16", "bf16-mixed"), ("16", "16-mixed"),
                                         (16, "16-mixed"), ("16-mixed", "16-mixed")])
def test_mixed_precision_and_aliases_autocast_for_the_device(given, name):
    plugin = precision_plugin(given, "cpu")
    assert isinstance(plugin, sprite.XPUMixedPrecision)
    assert (plugin.precision, plugin.device) == (name, "cpu")
    with plugin.autocast_context_manager():
        assert torch.is_autocast_enabled("cpu")


def test_true_precisions_pass_through_unchanged():
    assert type(precision_plugin("32-true")) is Precision
    assert isinstance(precision_plugin("bf16-true"), HalfPrecision)
    with pytest.raises(UsageError, match="'64-true'"):
        precision_plugin("64-true")
    with pytest.raises(UsageError, match="only autocast"):
        sprite.XPUMixedPrecision("32-true")
