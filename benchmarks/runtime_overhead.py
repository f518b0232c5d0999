"""What sprite's runtime costs a rank, each figure against a baseline measured in the same run.

(a) Step time: a small transformer trained by a 1-rank Trainer with sprite's XPUDDPStrategy against
    Lightning's own DDPStrategy, on whatever accelerator is here (CUDA on the H200, CPU here). Each arm is
    its own process, arms interleaved; steps are timed between two device synchronisations after warm-up.
(b) Start-up: `python -m sprite.runtime noop.py` (contract read, registries, Trainer wrapper) against
    `python noop.py`, where noop.py imports lightning and builds a Trainer.

    python benchmarks/runtime_overhead.py [--repeats 3] [--steps 200]
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
from pathlib import Path

NOOP = "import lightning as L\nL.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False)\n"


def worker(strategy: str, steps: int, warmup: int) -> None:
    import lightning as L
    import torch
    from lightning.pytorch.strategies import DDPStrategy
    from torch import nn
    from torch.utils.data import DataLoader

    from sprite import XPUDDPStrategy

    class Model(L.LightningModule):
        def __init__(self):
            super().__init__()
            layer = nn.TransformerEncoderLayer(512, 8, 2048, batch_first=True)
            self.net = nn.TransformerEncoder(layer, 4)
            self.times: list[float] = []

        def training_step(self, batch, batch_idx):
            if batch_idx in (warmup, warmup + steps):
                self.trained_on = str(self.device)  # Lightning moves the model back to the CPU after fit
                if self.device.type == "cuda":
                    torch.cuda.synchronize()
                self.times.append(time.perf_counter())
            return self.net(batch).float().pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=1e-3)

    data = [torch.randn(16, 256, 512)] * (warmup + steps + 1)  # one batch reused: no input pipeline in the timing
    chosen = XPUDDPStrategy() if strategy == "sprite" else DDPStrategy()
    model = Model()
    trainer = L.Trainer(devices=1, strategy=chosen, max_steps=warmup + steps + 1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        precision="bf16-mixed" if torch.cuda.is_available() else "32-true")
    trainer.fit(model, DataLoader(data, batch_size=None))
    print(json.dumps({"step_s": (model.times[1] - model.times[0]) / steps, "device": model.trained_on}))


def step_time(strategy: str, steps: int, warmup: int) -> tuple[float, str]:
    out = subprocess.run([sys.executable, __file__, "--worker", strategy, "--steps", str(steps),
                          "--warmup", str(warmup)], capture_output=True, text=True, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    return result["step_s"], result["device"]


def startup(repeats: int) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as tmp:
        noop = Path(tmp) / "noop.py"
        noop.write_text(NOOP)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SPRITE_", "MASTER_", "RANK", "WORLD_"))}
        env.update({"SPRITE_DEVICES": "1", "SPRITE_NUM_NODES": "1", "SPRITE_WORLD_SIZE": "1", "WORLD_SIZE": "1",
                    "RANK": "0", "LOCAL_RANK": "0", "SPRITE_LAUNCHER": "local", "SPRITE_STRATEGY": "auto",
                    "SPRITE_PRECISION": "auto", "SPRITE_ACCELERATOR": "auto"})
        pairs = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            subprocess.run([sys.executable, "-m", "sprite.runtime", str(noop)], env=env, check=True,
                           capture_output=True)
            t1 = time.perf_counter()
            subprocess.run([sys.executable, str(noop)], env=env, check=True, capture_output=True)
            pairs.append((t1 - t0, time.perf_counter() - t1))
    return statistics.median(p[0] for p in pairs), statistics.median(p[1] for p in pairs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", choices=["sprite", "lightning"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    args = parser.parse_args()
    if args.worker:
        return worker(args.worker, args.steps, args.warmup)
    runs = {"sprite": [], "lightning": []}
    for _ in range(args.repeats):
        for arm in runs:
            seconds, device = step_time(arm, args.steps, args.warmup)
            runs[arm].append(seconds)
    sprite_s, lightning_s = statistics.median(runs["sprite"]), statistics.median(runs["lightning"])
    print(f"(a) step time on {device}, {args.steps} steps after {args.warmup} warm-up, median of {args.repeats}:")
    print(f"    sprite XPUDDPStrategy {sprite_s * 1000:.3f} ms, baseline Lightning DDPStrategy "
          f"{lightning_s * 1000:.3f} ms, ratio {sprite_s / lightning_s:.4f} (target <= 1.01)")
    with_runtime, plain = startup(args.repeats)
    print(f"(b) start-up of a rank that builds a Trainer: python -m sprite.runtime {with_runtime:.2f} s, "
          f"baseline plain python {plain:.2f} s; overhead {with_runtime - plain:+.2f} s per rank")


if __name__ == "__main__":
    main()
