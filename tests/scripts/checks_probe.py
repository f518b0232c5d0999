"""A Lightning script for the fit-start checks: clean by default, each flag adds one fault seed 001 names.

--iterable  trains on an IterableDataset that every rank reads whole (not sharded)
--val N     validates on N samples (5 on 2 ranks: DistributedSampler repeats one)
--test N    then tests on N samples
--fsdp1     builds Lightning's FSDP1 FSDPStrategy

Each rank writes OUT/rank<N>.json with the collectives sprite's own modules called (torch.distributed
functions wrapped before the fit) and whether the fit finished.
"""

import argparse
import functools
import json
import os
import sys

import lightning as L
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

COLLECTIVES = ("all_gather", "all_gather_object", "all_gather_into_tensor", "all_reduce", "broadcast",
               "broadcast_object_list", "barrier", "gather", "scatter", "reduce_scatter", "all_to_all")
CALLS = []


def count_sprite_calls(name):
    original = getattr(dist, name)

    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        if sys._getframe(1).f_globals.get("__name__", "").startswith("sprite."):
            CALLS.append(name)
        return original(*args, **kwargs)

    setattr(dist, name, wrapper)


class Rows(IterableDataset):
    """Every rank iterates over all rows: Lightning does not shard an IterableDataset."""

    def __init__(self, x, y):
        self.x, self.y = x, y

    def __iter__(self):
        return iter(zip(self.x, self.y))


class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.net(x), y), sync_dist=True)

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.log("test_loss", nn.functional.mse_loss(self.net(x), y), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--iterable", action="store_true")
    parser.add_argument("--val", type=int, default=0)
    parser.add_argument("--test", type=int, default=0)
    parser.add_argument("--fsdp1", action="store_true")
    args = parser.parse_args()

    for name in COLLECTIVES:
        count_sprite_calls(name)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(36, 4, generator=gen)
    y = x.sum(dim=1, keepdim=True)
    train = Rows(x, y) if args.iterable else TensorDataset(x, y)
    extra = {}
    if args.fsdp1:
        from lightning.pytorch.strategies import FSDPStrategy

        extra["strategy"] = FSDPStrategy()
    trainer = L.Trainer(max_epochs=1, accumulate_grad_batches=2, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, **extra)
    model = Model()
    val = DataLoader(TensorDataset(x[: args.val], y[: args.val]), batch_size=2) if args.val else None
    trainer.fit(model, DataLoader(train, batch_size=8), val)
    if args.test:
        trainer.test(model, DataLoader(TensorDataset(x[: args.test], y[: args.test]), batch_size=2), verbose=False)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"rank{trainer.global_rank}.json"), "w") as f:
        json.dump({"rank": trainer.global_rank, "sprite_collectives": CALLS, "finished": True}, f)


if __name__ == "__main__":
    main()
