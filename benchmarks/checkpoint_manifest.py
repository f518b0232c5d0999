"""What sealing a checkpoint costs: Lightning's ``trainer.save_checkpoint`` with sprite's manifest (SHA-256 of
every file, manifest written last, fsyncs) against the same save without it, measured in the same process.

The sealed arm is what the runtime installs: the single-file write hashes the file from the page cache right
after ``torch.save`` wrote it (sprite/runtime/ckpt/save.py), rank 0 seals, and the fsyncs of a new name run in
the background (sprite/runtime/ckpt/durable.py). So the sealed save is timed until it returns (the ratio) and until it
is on disk too; each save starts after the one before is on disk (drained, then os.sync), so none shares the
disk with another's write-back. The state is the parity recipe's model (``sprite/parity/recipe.py``: a Qwen2
decoder with LoRA and a 2-class head; every frozen weight goes into the checkpoint too) after one AdamW step on
one device, so the checkpoint has the size a ``qwen2.5-0.5b-shape`` fit writes (about 2 GB in fp32). Saves
alternate between the two arms; the figures are medians over ``--repeats`` saves each. Target (issue 16): sealed
/ plain <= 1.15.

    python benchmarks/checkpoint_manifest.py [--model qwen2.5-0.5b-shape|tiny] [--repeats 5] [--dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path


def fitted_trainer(model_name: str, folder: Path):
    """A 1-device Trainer that has run one AdamW step of the parity recipe's model (so optimizer state exists)."""
    import lightning as L
    import torch

    from sprite.parity.recipe import build_model, row_loss
    from sprite.parity.settings import Settings

    class Recipe(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = build_model(Settings(model=model_name))

        def training_step(self, batch, batch_idx):
            return row_loss(self.model, *batch)

        def configure_optimizers(self):
            return torch.optim.AdamW([p for p in self.parameters() if p.requires_grad], lr=1e-4)

    module = Recipe()
    vocab = module.model.backbone.config.vocab_size
    rows = [(torch.randint(0, vocab, (32,)), torch.tensor(1))] * 2
    trainer = L.Trainer(max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, devices=1, default_root_dir=str(folder))
    trainer.fit(module, torch.utils.data.DataLoader(rows, batch_size=2))
    return trainer


def timed(save, path: Path) -> float:
    start = time.perf_counter()
    save(path)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-0.5b-shape", help="a parity preset (tiny on a small CPU box)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dir", help="folder to save into (default: a temporary folder)")
    args = parser.parse_args()

    from lightning.fabric.plugins.io import torch_io
    from lightning.pytorch import Trainer

    from sprite.runtime.ckpt import seal as ckpt_seal
    from sprite.runtime.ckpt import durable
    from sprite.runtime.ckpt import save as hashed_save

    folder = Path(tempfile.mkdtemp(prefix="ckpt-bench-", dir=args.dir))
    trainer = fitted_trainer(args.model, folder)
    original = Trainer.save_checkpoint
    lightning_write = torch_io._atomic_save

    def plain(path):
        torch_io._atomic_save = lightning_write
        original(trainer, path)

    def sealed(path):  # what the runtime installs: the hashing write and the sealing wrapper
        torch_io._atomic_save = hashed_save.atomic_save
        ckpt_seal.save_checkpoint(original, trainer, path)

    arms = {"plain": plain, "sealed": sealed}
    times: dict[str, list[float]] = {name: [] for name in (*arms, "durable")}
    size = 0
    for repeat in range(args.repeats + 1):  # the first round warms the page cache and allocator; not counted
        for name in (("plain", "sealed") if repeat % 2 else ("sealed", "plain")):
            path = folder / f"{name}-{repeat}.ckpt"
            os.sync()
            seconds = timed(arms[name], path)
            on_disk = seconds + timed(lambda _: durable.drain(), path)
            durable.check()
            size = path.stat().st_size
            if repeat:
                times[name].append(seconds)
                if name == "sealed":
                    times["durable"].append(on_disk)
            for leftover in folder.glob(f"{name}-{repeat}.ckpt*"):
                leftover.unlink()
    shutil.rmtree(folder)
    plain, sealed = statistics.median(times["plain"]), statistics.median(times["sealed"])
    on_disk = statistics.median(times["durable"])
    print(json.dumps({"model": args.model, "checkpoint_bytes": size, "repeats": args.repeats,
                      "plain_s": times["plain"], "sealed_s": times["sealed"], "sealed_on_disk_s": times["durable"],
                      "plain_median_s": round(plain, 4), "sealed_median_s": round(sealed, 4),
                      "sealed_on_disk_median_s": round(on_disk, 4), "ratio": round(sealed / plain, 3),
                      "target": 1.15, "host": os.uname().nodename}, indent=1))
    print(f"model {args.model}: {size / 2**20:.0f} MiB checkpoint; plain save {plain:.3f} s, with manifest"
          f" {sealed:.3f} s: {sealed / plain:.2f}x the plain save (target <= 1.15x); on disk after {on_disk:.3f} s")


if __name__ == "__main__":
    main()
