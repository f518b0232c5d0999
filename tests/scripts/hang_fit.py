"""A small 2-rank Lightning fit in which one rank hangs on request (the hang diagnosis tests' script, issue 27).

    --hang KIND --rank R --step S --work DIR
      train-sleep       rank R sleeps (an hour) in training_step at step S
      loader            rank R's dataset blocks in __getitem__ for the batch of step S
      val-sleep         rank R sleeps in validation_step in the first validation after step S
      extra-collective  rank R calls one torch.distributed.barrier() in training_step at step S that no other rank calls
      fifo              rank R reads a FIFO nobody writes (read_fifo) in training_step at step S
      c-loop            rank R runs one long torch op (long_torch_op: matrix_power) in training_step at step S
      plain-sleep       no Trainer: a plain torch.distributed loop reporting steps with sprite.beat; rank R sleeps
                        in plain_step at step S
      fabric-sleep      a Lightning Fabric loop reporting steps with sprite.beat; rank R sleeps in fabric_step
Every hang prints "rank R hangs: KIND" first.
"""

import argparse
import os
import time

import lightning as L
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, Dataset

torch.set_num_threads(1)  # the busy rank keeps one core, not all


def announce(args):
    print(f"rank {args.rank} hangs: {args.hang}", flush=True)


def read_fifo(path):
    os.mkfifo(path)
    with open(path) as fifo:  # blocks here: nobody opens the other end
        return fifo.read()


def long_torch_op():
    a = torch.rand(2048, 2048) / 2048
    return torch.linalg.matrix_power(a, 2**62)  # ~120 matmuls of 2048x2048 in one C call


class Rows(Dataset):
    def __init__(self, args, rows, train=True):
        self.args, self.rows, self.fetched, self.train = args, rows, 0, train
        self.x = torch.randn(rows, 8, generator=torch.Generator().manual_seed(0))

    def __len__(self):
        return self.rows

    def __getitem__(self, i):
        a = self.args
        self.fetched += 1
        if a.hang == "loader" and self.train and int(os.environ["RANK"]) == a.rank and self.fetched == a.step * 4 + 1:
            announce(a)
            time.sleep(3600)
        return self.x[i], self.x[i].sum(0, keepdim=True)


class Model(L.LightningModule):
    def __init__(self, args):
        super().__init__()
        self.args = args
        self.net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))

    def _mine(self, kind):
        a = self.args
        return a.hang == kind and self.global_rank == a.rank and self.global_step == a.step

    def training_step(self, batch, batch_idx):
        a = self.args
        if self._mine("train-sleep"):
            announce(a)
            time.sleep(3600)
        if self._mine("extra-collective"):
            announce(a)
            dist.barrier()
        if self._mine("fifo"):
            announce(a)
            read_fifo(os.path.join(a.work, f"fifo-{os.getpid()}"))
        if self._mine("c-loop"):
            announce(a)
            long_torch_op()
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def validation_step(self, batch, batch_idx):
        a = self.args
        if (a.hang == "val-sleep" and self.global_rank == a.rank and self.global_step >= a.step
                and not self.trainer.sanity_checking):
            announce(a)
            time.sleep(3600)
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.net(x), y), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def plain_step(args, step, model, x):
    if args.hang == "plain-sleep" and dist.get_rank() == args.rank and step == args.step:
        announce(args)
        time.sleep(3600)
    loss = model(x).pow(2).mean()
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)


def plain(args):
    import sprite

    dist.init_process_group("gloo")
    model = nn.Linear(8, 1)
    for step in range(args.max_steps):
        plain_step(args, step, model, torch.randn(4, 8))
        sprite.beat(step)
    print(f"rank {dist.get_rank()} finished at step {step}", flush=True)
    dist.destroy_process_group()


def fabric_step(args, fabric, step, model, optimizer):
    if fabric.global_rank == args.rank and step == args.step:
        announce(args)
        time.sleep(3600)
    fabric.backward(model(torch.randn(4, 8)).pow(2).mean())
    optimizer.step()
    optimizer.zero_grad()


def fabric_loop(args):
    import sprite

    fabric = L.Fabric()
    fabric.launch()
    model = fabric.setup_module(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)))
    optimizer = fabric.setup_optimizers(torch.optim.SGD(model.parameters(), lr=0.1))
    for step in range(args.max_steps):
        fabric_step(args, fabric, step, model, optimizer)
        sprite.beat(step)
    print(f"rank {fabric.global_rank} finished at step {step}", flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--hang", default="none")
    p.add_argument("--rank", type=int, default=1)
    p.add_argument("--step", type=int, default=3)
    p.add_argument("--work", default=".")
    p.add_argument("--max-steps", type=int, default=12)
    a = p.parse_args()
    if a.hang.startswith("plain"):
        return plain(a)
    if a.hang.startswith("fabric"):
        return fabric_loop(a)
    L.seed_everything(0, verbose=False)
    trainer = L.Trainer(max_steps=a.max_steps, val_check_interval=4, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Model(a), DataLoader(Rows(a, 128), batch_size=4), DataLoader(Rows(a, 16, train=False), batch_size=4))
    print(f"rank {trainer.global_rank} finished at step {trainer.global_step}", flush=True)


if __name__ == "__main__":
    main()
