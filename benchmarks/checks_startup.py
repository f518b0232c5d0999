"""What the fit-start checks cost: fit start-up with the checks against --no-checks, measured in the same run.

Fit start-up is the time from ``trainer.fit(...)`` to the first ``training_step`` on each rank (process group,
strategy set-up, sanity check, loaders; with the checks also the world block, the environment and evaluation
checks and the one all-gather of first-batch digests). The time spent inside the checks' hooks is also measured
directly, as a share of that start-up. The slowest rank counts. Launches alternate between the two arms
(``sprite run --devices N --accelerator cpu``, local supervisor); medians over the repeats.

    python benchmarks/checks_startup.py [--repeats 5] [--devices 2]
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

WORKER = '''
import json, os, sys, time
import lightning as L, torch
from torch.utils.data import DataLoader, TensorDataset

class M(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(16, 1)
    def training_step(self, batch, batch_idx):
        if batch_idx == 0:
            self.first = time.perf_counter()
        return self.net(batch[0]).pow(2).mean()
    def validation_step(self, batch, batch_idx):
        self.log("v", self.net(batch[0]).mean(), sync_dist=True)
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

def timed(hook, spent):
    def wrapper(*args, **kwargs):
        began = time.perf_counter()
        try:
            return hook(*args, **kwargs)
        finally:
            spent.append(time.perf_counter() - began)
    return wrapper

x = torch.randn(256, 16)
trainer = L.Trainer(max_steps=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False)
spent = []  # seconds inside the checks' hooks (FitChecks, added by sprite's runtime unless --no-checks)
for callback in trainer.callbacks:
    if type(callback).__name__ == "FitChecks":
        for name in ("on_train_start", "on_train_batch_start", "on_validation_start"):
            setattr(callback, name, timed(getattr(callback, name), spent))
model = M()
start = time.perf_counter()
trainer.fit(model, DataLoader(TensorDataset(x), batch_size=8), DataLoader(TensorDataset(x[:64]), batch_size=8))
with open(os.path.join(sys.argv[1], f"rank{trainer.global_rank}.json"), "w") as f:
    json.dump({"startup_s": model.first - start, "checks_s": sum(spent)}, f)
'''


def launch(worker: Path, out: Path, devices: int, checks: bool) -> tuple[float, float, float]:
    """(fit start-up, time inside the checks' hooks, wall time of the launch); the slowest rank's figures."""
    out.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPRITE_", "MASTER_", "RANK", "WORLD_"))}
    sprite = [sys.executable, "-m", "sprite", "run", "--devices", str(devices), "--accelerator", "cpu",
              "--launcher", "local", *([] if checks else ["--no-checks"]), str(worker), str(out)]
    began = time.perf_counter()
    subprocess.run(sprite, env=env, check=True, capture_output=True, cwd=out)
    wall = time.perf_counter() - began
    ranks = [json.loads(p.read_text()) for p in out.glob("rank*.json")]
    return max(r["startup_s"] for r in ranks), max(r["checks_s"] for r in ranks), wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--devices", type=int, default=2)
    args = parser.parse_args()
    results: dict[bool, list[tuple[float, float, float]]] = {True: [], False: []}
    with tempfile.TemporaryDirectory() as tmp:
        worker = Path(tmp) / "worker.py"
        worker.write_text(WORKER)
        for i in range(args.repeats):
            for checks in ((True, False) if i % 2 == 0 else (False, True)):
                results[checks].append(launch(worker, Path(tmp) / f"{i}-{checks}", args.devices, checks))
    med = {arm: [statistics.median(r[i] for r in rows) for i in range(3)] for arm, rows in results.items()}
    (on_start, on_hooks, on_wall), (off_start, _, off_wall) = med[True], med[False]
    print(f"{args.devices} CPU ranks, {args.repeats} launches per arm, medians")
    print(f"fit start-up   checks {on_start:.3f} s   --no-checks {off_start:.3f} s   ratio {on_start / off_start:.3f}")
    print(f"checks' hooks  {on_hooks * 1000:.1f} ms = {on_hooks / on_start:.3f} of the fit start-up with checks"
          " (includes waiting for the slowest rank at the all-gather)")
    print(f"launch wall    checks {on_wall:.2f} s   --no-checks {off_wall:.2f} s   ratio {on_wall / off_wall:.3f}")

if __name__ == "__main__":
    main()
