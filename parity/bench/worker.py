"""What every rank of every `sprite bench` arm measures, shared by the Lightning script and the raw loop.

A rank counts the FLOPs of warm-up step 0, compiles after it when asked, times its windows (bench_timer), and
at the end writes its record: ``runs/w<world>/<arm>-r<repeat>/rank<r>.json``. Which step is which (warm-up,
synced, no-sync, probe) comes from the run's settings, so every rank of every arm follows the same plan.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import platform
import sys

import torch

from sprite.parity.bench import model as bench_model
from sprite.parity.bench import peaks as bench_peaks
from sprite.parity.bench import store as bench_store
from sprite.parity.bench.flops import StepFlops
from sprite.parity.bench.timer import LoaderClock, StepTimer
from sprite.integrity.writeonce import exists_error


def parse(argv: list[str] | None, prog: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--out", required=True, type=pathlib.Path)
    parser.add_argument("--world", required=True, type=int)
    parser.add_argument("--arm", required=True)
    parser.add_argument("--repeat", required=True, type=int)
    return parser.parse_args(argv)


class Measure:
    """One rank's instrument. Raises IntegrityError at construction if this rank's record already exists."""

    def __init__(self, args: argparse.Namespace, kind, device: torch.device, rank: int, vocab: int):
        self.settings = bench_store.load_settings(args.out)
        self.args, self.kind, self.device, self.rank = args, kind, device, rank
        self.target = bench_store.arm_dir(args.out, args.world, args.arm, args.repeat)
        if (self.target / f"rank{rank}.json").exists():  # checked before training, written after
            raise exists_error(self.target / f"rank{rank}.json", "a rank's record")
        probe = self.settings.probes(args.world, args.arm)
        self.plan = self.settings.step_plan(args.world, probe)
        self.loader = LoaderClock(bench_model.loader(self.settings, self.plan, vocab, rank))
        self.timer = StepTimer(kind, device, self.settings.phases(args.world, probe), self.loader)
        self.flops = StepFlops()
        self.peak = self._measured_peak()
        kind.reset_peak_memory(device)  # the peak of training, not of the GEMMs above or of loading the model

    def _measured_peak(self) -> dict | None:
        if not self.settings.measure_peak:
            return None
        tflops, source = bench_peaks.measure_peak(self.kind, self.device, self.settings.precision)
        return {"tflops": tflops, "source": source}

    @property
    def steps(self) -> int:
        return len(self.plan)

    def grad_sync(self, index: int) -> bool:
        """Whether step ``index`` synchronises gradients (every step but the no-sync windows')."""
        return self.plan[index][0] != "nosync"

    def before_step(self, index: int) -> None:
        if index == 0:
            self.flops.start()

    def after_step(self, index: int, model: torch.nn.Module) -> None:
        """Ends FLOP counting after step 0 (then compiles ``model``'s blocks with --compile); times windows."""
        if index == 0:
            self.flops.stop()
            if self.settings.compile:
                bench_model.compile_blocks(model)
        self.timer.step_end(index)

    def finish(self, extra: dict) -> None:
        """Writes this rank's record. Raises IntegrityError if it exists, RuntimeError if a window never ran."""
        if not self.timer.done:
            raise RuntimeError(f"only {len(self.timer.records)} timed windows ran; the step plan was not followed")
        peak = bench_peaks.table_peak(self.device_name, self.settings.precision, self.compute_units)
        record = {
            "rank": self.rank, "world": self.args.world, "arm": self.args.arm, "repeat": self.args.repeat,
            "device": str(self.device), "device_name": self.device_name, "compute_units": self.compute_units,
            "table_peak": {"tflops": peak.tflops, "source": peak.source}, "measured_peak": self.peak,
            "flops_per_step": self.flops.total, "flops_by_op": self.flops.by_op, "windows": self.timer.records,
            "memory": self.timer.memory, "threads": torch.get_num_threads(), "torch": torch.__version__,
            "python": platform.python_version(), "host": platform.node(), "pid": os.getpid(),
            # a fork of a warm server (sprite.launch.warmserver) rather than a fresh interpreter
            "warm_served": bool(getattr(sys.modules.get("sprite.contract.warm"), "SERVED", False)), **extra,
        }
        bench_store.write_rank(self.target, self.rank, record)

    @property
    def device_name(self) -> str:
        return self.kind.device_name(self.device)

    @property
    def compute_units(self) -> int | None:
        return self.kind.compute_units(self.device)
