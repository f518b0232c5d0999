"""A plain Lightning script: nothing in it knows about sprite, XPU, MPI or the number of ranks.

    sprite run --devices 2 examples/train.py --max-steps 20

``sprite run`` starts every rank as ``python -m sprite.runtime examples/train.py ...``; the runtime gives the
``Trainer`` below its accelerator, devices, nodes, strategy and precision from the launched world.
"""

import argparse
import json
import os

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Regressor(L.LightningModule):
    def __init__(self, width: int = 32, lr: float = 0.05):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, width), nn.Tanh(), nn.Linear(width, 1))
        self.lr = lr
        self.last_loss = float("nan")

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.last_loss = float(loss.detach())
        self.log("loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def make_data(rows: int = 256) -> TensorDataset:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(rows, 8, generator=gen)
    y = x.sum(dim=1, keepdim=True).sin()
    return TensorDataset(x, y)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-steps", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--out", help="write each rank's final loss to OUT/rank<N>.json")
    args = parser.parse_args()

    L.seed_everything(0, verbose=False)
    model = Regressor()
    trainer = L.Trainer(max_steps=args.max_steps, logger=False, enable_checkpointing=False)
    trainer.fit(model, DataLoader(make_data(), batch_size=args.batch_size))

    rank = trainer.global_rank
    print(f"rank {rank}/{trainer.world_size}: final loss {model.last_loss:.6f}", flush=True)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
            json.dump({"rank": rank, "world_size": trainer.world_size, "loss": model.last_loss}, f)


if __name__ == "__main__":
    main()
