"""What goodput's bookkeeping costs a training step, against a baseline measured in the same run.

One 1-rank Lightning fit of a small MLP on the CPU (one torch thread) in which sprite's Cadence callback is
switched per block of steps, blocks interleaved: ``baseline`` (the callback skipped), ``records`` (as every
launch with a run folder has it: the ``first_step`` audit record, then one check per step) and ``cadence``
(``--checkpoint-every 1h``: rank 0's clock compared at every optimizer step; no save comes due). Interleaving in
one process keeps a busy machine's drift out of the ratio. The checkpoint's ``stall_seconds``/``resumed_at`` fields
add two clock reads to each save and are not measured here. A world of one rank skips the cadence's all-reduce;
with several ranks it is one one-element MAX all-reduce per optimizer step (the preemption check pays the same).
Prints each arm's median step time over the repeats (processes) and the ratio to the baseline.

    python benchmarks/goodput_bookkeeping.py [--repeats 3] [--steps 600]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ARMS = ("baseline", "records", "cadence")


def worker(steps: int, warmup: int, block: int) -> None:
    import lightning as L
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from sprite.runtime.ckpt import cadence

    torch.set_num_threads(1)
    os.environ.update(SPRITE_RUN_DIR=tempfile.mkdtemp(), SPRITE_ATTEMPT="1")
    arms = {"records": cadence.Cadence({"SPRITE_RUN_DIR": "x"}),
            "cadence": cadence.Cadence({"SPRITE_RUN_DIR": "x", "SPRITE_CHECKPOINT_EVERY": "3600"})}
    gaps: dict[str, list[float]] = {arm: [] for arm in ARMS}

    class Switch(L.Callback):
        """Calls the arm's Cadence hooks for this block of steps; times each step from start to start."""

        def __init__(self):
            self.last, self.arm = None, "baseline"

        def on_train_batch_start(self, trainer, module, batch, index):
            now = time.perf_counter()
            if self.last is not None and index > warmup:
                gaps[self.arm].append(now - self.last)
            self.last, self.arm = now, ARMS[(index // block) % len(ARMS)]
            if self.arm in arms:
                arms[self.arm].on_train_batch_start(trainer, module, batch, index)

        def on_train_batch_end(self, trainer, module, outputs, batch, index):
            if self.arm in arms:
                arms[self.arm].on_train_batch_end(trainer, module, outputs, batch, index)

    class Model(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 1))

        def training_step(self, batch, batch_idx):
            x, y = batch
            return nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    x = torch.randn(64 * (steps + warmup + 1), 256, generator=torch.Generator().manual_seed(0))
    loader = DataLoader(TensorDataset(x, x[:, :1]), batch_size=64)
    trainer = L.Trainer(max_steps=steps + warmup, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=[Switch()],
                        accelerator="cpu", devices=1)
    trainer.fit(Model(), loader)
    print(json.dumps({arm: statistics.median(values) for arm, values in gaps.items()}))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--block", type=int, default=10)
    parser.add_argument("--worker", action="store_true")
    args = parser.parse_args()
    if args.worker:
        worker(args.steps, args.warmup, args.block)
        return
    found: dict[str, list[float]] = {arm: [] for arm in ARMS}
    for _ in range(args.repeats):
        out = subprocess.run([sys.executable, __file__, "--worker", "--steps", str(args.steps), "--warmup",
                              str(args.warmup), "--block", str(args.block)], capture_output=True, text=True,
                             check=True)
        for arm, median in json.loads(out.stdout.strip().splitlines()[-1]).items():
            found[arm].append(median)
    for arm in ARMS:
        ratios = [m / b for m, b in zip(found[arm], found["baseline"])]
        print(f"{arm:9s} median step {1e3 * statistics.median(found[arm]):7.3f} ms  ratio to the baseline of the "
              f"same process: median {statistics.median(ratios):.3f} (repeats {', '.join(f'{r:.3f}' for r in ratios)})")
    print(f"the hook alone: {hook_microseconds():.2f} us a step (Cadence.on_train_batch_end with a clock, one rank)")


def hook_microseconds(calls: int = 200_000) -> float:
    """Microseconds one ``--checkpoint-every`` step check costs, less an empty call's (a fake one-rank trainer)."""
    from types import SimpleNamespace

    from sprite.runtime.ckpt import cadence

    hook = cadence.Cadence({"SPRITE_RUN_DIR": "x", "SPRITE_CHECKPOINT_EVERY": "3600"})
    hook.last = time.time()
    trainer = SimpleNamespace(global_step=0, is_global_zero=True, world_size=1)

    def empty(trainer, module, outputs, batch, index):
        return None

    timed = {}
    for name, call in (("empty", empty), ("hook", hook.on_train_batch_end)):
        start = time.perf_counter()
        for step in range(calls):
            trainer.global_step = step + 1
            call(trainer, None, None, None, step)
        timed[name] = time.perf_counter() - start
    return 1e6 * (timed["hook"] - timed["empty"]) / calls


if __name__ == "__main__":
    main()
