"""What a `sprite bench` rank measures, in one process: FLOPs against hand counts, the peak table, windows timed
between two synchronisations, gradient synchronisation switched off for the communication time, and the
device table's measurement calls."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
from torch import nn

from sprite.parity.bench import model as bench_model
from sprite.parity.bench.flops import attention_backward, attention_forward, count
from sprite.parity.bench.peaks import table_peak
from sprite.parity.bench.settings import BenchSettings, Window
from sprite.parity.bench.timer import LoaderClock, StepTimer
from sprite.runtime.devices import DEVICE_TABLE

os.environ.setdefault("HF_HUB_OFFLINE", "1")
B, IN, HID, OUT = 4, 8, 16, 3


def _pair(first_trains: bool, second_trains: bool):
    torch.manual_seed(0)
    first, second = nn.Linear(IN, HID, bias=False), nn.Linear(HID, OUT, bias=False)
    first.weight.requires_grad_(first_trains)
    second.weight.requires_grad_(second_trains)
    return first, second, torch.randn(B, IN)


def test_flops_of_linear_layers_equal_the_hand_count():
    forward = 2 * B * IN * HID + 2 * B * HID * OUT
    first, second, x = _pair(True, True)
    with torch.no_grad():
        assert count(lambda: second(first(x))) == forward
    # Both trained: dW1 (2*B*IN*HID), the gradient into HID (2*B*HID*OUT) and dW2 (2*B*HID*OUT); x needs none.
    first, second, x = _pair(True, True)
    assert count(lambda: second(first(x)).sum().backward()) == forward + 2 * B * IN * HID + 4 * B * HID * OUT
    # A frozen second weight still passes the gradient back to the trained first layer, but has no dW2.
    first, second, x = _pair(True, False)
    assert count(lambda: second(first(x)).sum().backward()) == forward + 2 * B * IN * HID + 2 * B * HID * OUT
    # A frozen first layer needs no backward at all; only dW2 remains.
    first, second, x = _pair(False, True)
    assert count(lambda: second(first(x)).sum().backward()) == forward + 2 * B * HID * OUT


def test_fused_attention_counts_as_eager_attention_on_this_device():
    from torch.utils.flop_counter import FlopCounterMode

    ids, labels, totals = torch.randint(0, 256, (2, 16)), torch.tensor([0, 1]), {}
    for impl in ("eager", "sdpa"):
        model = bench_model.build(BenchSettings(attention=impl, batch=2, seq=16))
        totals[impl] = count(lambda: bench_model.loss(model, ids, labels).backward())
    assert totals["sdpa"] == totals["eager"] > 0
    with FlopCounterMode(display=False) as plain:  # torch's own registry misses the CPU fused kernel
        bench_model.loss(model, ids, labels).backward()
    assert plain.get_total_flops() < totals["sdpa"]
    # GQA: 4 query heads over 2 key/value heads count as 4 full heads, as eager's repeat_kv computes them.
    assert attention_forward((2, 4, 16, 8), (2, 2, 16, 8), (2, 2, 16, 8)) == 2 * 2 * 4 * 16 * 16 * (8 + 8)
    backward = attention_backward((2, 4, 16, 8), (2, 4, 16, 8), (2, 2, 16, 8), (2, 2, 16, 8))
    assert backward == 2 * 2 * 2 * 4 * 16 * 16 * 16


def test_peak_table_by_device_name_with_source():
    assert table_peak("NVIDIA H200", "bf16-mixed").tflops == 989.0
    assert table_peak("NVIDIA H100 80GB HBM3", "bf16-mixed").tflops == 989.0
    assert table_peak("NVIDIA A100-SXM4-80GB", "bf16-true").tflops == 312.0
    tile = table_peak("Intel(R) Data Center GPU Max 1550", "bf16-mixed", compute_units=512)
    assert tile.tflops == pytest.approx(512 * 512 * 1.6e9 / 1e12) and "512 EUs" in tile.source
    assert table_peak("Intel(R) Data Center GPU Max 1550", "bf16-mixed", compute_units=448).tflops < tile.tflops
    for name, precision, why in (("NVIDIA H100 PCIe", "bf16-mixed", "no peak for 'NVIDIA H100 PCIe'"),
                                 ("cpu (x86_64)", "bf16-mixed", "--measure-peak"),
                                 ("NVIDIA H200", "32-true", "bf16 peaks only")):
        unknown = table_peak(name, precision)
        assert unknown.tflops is None and why in unknown.source
    assert "datasheet" in table_peak("NVIDIA H200", "bf16-mixed").source


class CountingDevice:
    """A device-table row stand-in that counts synchronize calls (a named fake: no device here to drain)."""

    def __init__(self):
        self.syncs = 0

    def synchronize(self, device=None):
        self.syncs += 1

    def peak_memory(self, device=None):
        return {"allocated": self.syncs, "reserved": 2 * self.syncs}


def test_steps_are_timed_in_windows_with_one_synchronisation_at_each_end():
    settings = BenchSettings(steps=6, window=3, warmup=2, batch=4)
    windows = settings.windows(world=2, probe=True)
    assert [(w.mode, w.batch) for w in windows] == [("sync", 4), ("nosync", 4), ("sync", 4), ("nosync", 4),
                                                     ("probe", 8)]
    plan = settings.step_plan(world=2, probe=True)
    # Warm-up, 2 x (synced, no-sync), a warm-up at the probe's batch (a compiled step recompiles), the probe.
    assert plan == ([("warmup", 4)] * 2 + ([("sync", 4)] * 3 + [("nosync", 4)] * 3) * 2 + [("probe_warmup", 8)] * 2
                    + [("probe", 8)] * 3)
    device, clock = CountingDevice(), LoaderClock([0] * len(plan))
    timer = StepTimer(device, None, settings.phases(world=2, probe=True), clock)
    for index, _ in enumerate(clock):
        timer.step_end(index)
    assert device.syncs == len(windows) + 2 and timer.done  # 19 steps, 7 synchronisations
    assert [(r["mode"], r["steps"]) for r in timer.records] == [(w.mode, w.steps) for w in windows]
    assert timer.memory == {"allocated": 2, "reserved": 4}  # read at the end of the first synced window
    assert settings.windows(world=1, probe=False) == [Window("sync", 4, 3)] * 2  # no communication at 1 rank


@pytest.fixture
def one_rank_group(tmp_path):
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_no_sync_switches_gradient_communication_off_and_on(one_rank_group):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel

    ddp, calls = DistributedDataParallel(nn.Linear(4, 4)), []

    def counting_hook(state, bucket):
        calls.append(1)
        done = torch.futures.Future()
        done.set_result(bucket.buffer())
        return done

    ddp.register_comm_hook(None, counting_hook)
    x = torch.randn(2, 4)
    for enabled, expected in ((True, 1), (False, 1), (True, 2)):
        bench_model.set_grad_sync([ddp], enabled)
        ddp(x).sum().backward()
        assert len(calls) == expected
    sharded = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    fully_shard(sharded, mesh=init_device_mesh("cpu", (1,)))
    bench_model.set_grad_sync([sharded], False)
    sharded(x).sum().backward()
    assert sharded[0].weight.grad is None  # not reduced into the sharded gradient
    bench_model.set_grad_sync([sharded], True)
    sharded(x).sum().backward()
    assert sharded[0].weight.grad is not None


def test_compile_blocks_compiles_each_decoder_block_in_place():
    model = bench_model.build(BenchSettings())
    blocks = bench_model.blocks(model)
    assert len(blocks) == 2 and all(getattr(b, "_compiled_call_impl", None) is None for b in blocks)
    bench_model.compile_blocks(model)
    assert all(b._compiled_call_impl is not None for b in blocks)


class FakeXPUModule:
    """Stands in for ``torch.xpu`` with the measurement calls the device table makes."""

    def __init__(self):
        self.synced = []

    def is_available(self):
        return True

    def synchronize(self, device=None):
        self.synced.append(device)

    def max_memory_allocated(self, device=None):
        return 3 * 2**30

    def max_memory_reserved(self, device=None):
        return 4 * 2**30

    def get_device_name(self, device=None):
        return "Intel(R) Data Center GPU Max 1550"

    def get_device_properties(self, device=None):
        return type("Props", (), {"gpu_eu_count": 512})()

    def empty_cache(self):
        self.synced.append("empty_cache")

    def reset_peak_memory_stats(self, device=None):
        self.synced.append(("reset", device))


def test_device_table_measurement_calls(monkeypatch):
    cpu = DEVICE_TABLE["cpu"]
    cpu.synchronize()
    assert cpu.peak_memory() is None and cpu.compute_units() is None and cpu.device_name().startswith("cpu")
    fake = FakeXPUModule()
    monkeypatch.setattr(torch, "xpu", fake)
    xpu = DEVICE_TABLE["xpu"]
    xpu.synchronize("xpu:1")
    xpu.reset_peak_memory("xpu:1")
    assert fake.synced == ["xpu:1", "empty_cache", ("reset", "xpu:1")]
    assert xpu.peak_memory() == {"allocated": 3 * 2**30, "reserved": 4 * 2**30}
    peak = table_peak(xpu.device_name(), "bf16-mixed", xpu.compute_units())
    assert peak.tflops == pytest.approx(419.43, rel=1e-3)


def test_step_0_counts_flops_then_compile_compiles_the_blocks(tmp_path):
    import argparse

    from sprite.parity.bench import store as bench_store
    from sprite.parity.bench.worker import Measure

    settings = BenchSettings(batch=2, seq=16, compile=True, warmup=2)
    bench_store.claim(tmp_path / "run", settings)
    args = argparse.Namespace(out=tmp_path / "run", world=1, arm="sprite", repeat=0)
    measure = Measure(args, DEVICE_TABLE["cpu"], torch.device("cpu"), 0, vocab=256)
    model = bench_model.build(settings)
    ids, labels = next(iter(measure.loader))
    assert ids.shape == (2, 16) and len(measure.loader) == measure.steps == 2 + 40 + 2 + 10  # warm-ups, windows
    measure.before_step(0)
    bench_model.loss(model, ids, labels).backward()
    assert all(getattr(b, "_compiled_call_impl", None) is None for b in bench_model.blocks(model))
    measure.after_step(0, model)
    assert measure.flops.total > 0 and "aten.mm" in measure.flops.by_op
    assert all(b._compiled_call_impl is not None for b in bench_model.blocks(model))


def test_the_launch_bound_probe_runs_in_sprite_s_arm_at_the_smallest_world_only():
    settings = BenchSettings(sweep=(4, 2, 8), baselines=("raw",))
    assert [world for world in (2, 4, 8) if settings.probes(world, "sprite")] == [2]
    assert not settings.probes(2, "raw")


def test_measure_peak_times_gemms_in_the_steps_dtype():
    """docs/bench.md: --measure-peak times GEMMs in the step's dtype (bf16 for both bf16 precisions)."""
    from sprite.parity.bench.peaks import measure_peak
    from sprite.runtime.devices import DEVICE_TABLE

    for precision, dtype in (("bf16-mixed", "bfloat16"), ("bf16-true", "bfloat16"), ("32-true", "float32")):
        tflops, said = measure_peak(DEVICE_TABLE["cpu"], torch.device("cpu"), precision, repeats=1)
        assert tflops > 0 and f"512x512 {dtype} GEMMs" in said, said
