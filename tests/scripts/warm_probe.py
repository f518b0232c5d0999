"""A 2-rank CPU fit that records what a forked rank must have as a fresh interpreter would (tests/test_warmstart.py).

Each rank writes OUT/rank<N>.json after a short fit (with its private memory after a full collection); at exit an
atexit handler writes OUT/atexit<N>.
``--fail-rank N`` makes rank N exit with code 3 after its record.
"""

import argparse
import atexit
import gc
import json
import os
import signal
import sys

import lightning as L
import numpy as np
import torch
from lightning_utilities.core.rank_zero import rank_zero_only
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Linear(4, 1)
        self.losses = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.losses.append(float(loss.detach()))
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def memory() -> dict:
    """This process's resident memory in kB: ``Rss``, and ``private`` (pages no other process maps)."""
    with open("/proc/self/smaps_rollup") as f:
        fields = {line.split(":")[0]: int(line.split()[1]) for line in f if line.split()[-1:] == ["kB"]}
    return {"rss": fields["Rss"], "private": fields["Private_Clean"] + fields["Private_Dirty"]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--fail-rank", type=int, default=-1)
    args = parser.parse_args()
    rank = int(os.environ["RANK"])
    atexit.register(lambda: open(os.path.join(args.out, f"atexit{rank}"), "w").close())
    with open("/proc/self/cmdline", "rb") as f:
        cmdline = f.read().decode().split("\0")
    record = {"rank": rank, "rank_zero_only": rank_zero_only.rank, "cmdline": cmdline, "argv": sys.argv[1:],
              "threads": torch.get_num_threads(), "numpy_draw": float(np.random.random()),
              "main": sys.modules["__main__"].__file__,
              "handlers": {sig.name: getattr(signal.getsignal(sig), "__qualname__", str(signal.getsignal(sig)))
                           for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2, signal.SIGCHLD)}}
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
    model = Model()
    trainer = L.Trainer(max_steps=4, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(model, DataLoader(data, batch_size=8))
    record["losses"] = model.losses
    gc.collect()  # a full collection: it writes to every object it traverses
    record["memory_kb"] = memory()
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
        json.dump(record, f)
    if rank == args.fail_rank:
        sys.exit(3)


if __name__ == "__main__":
    main()
