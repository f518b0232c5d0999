"""A small Lightning fit with a validation loop that misbehaves on request (the fault tests' script).

    --sleep-rank R --sleep-step S   rank R sleeps (for an hour) inside training_step at step S: a stall
    --kill-rank R --kill-step S     rank R kills itself with SIGKILL at step S, once per --marker file, once its
                                    background save in flight is sealed (a kill mid-save: test_ckpt_background.py)
    --raise-rank R --raise-step S   rank R raises ValueError at step S
    --guarded-save PATH             after fit, only rank 0 calls trainer.save_checkpoint(PATH)
    --checkpoint-dir DIR            a ModelCheckpoint in DIR every 2 steps, every one kept
    --strategy NAME                 the Trainer's strategy (default: the launch's)
"""

import argparse
import os
import signal
import time

import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Model(L.LightningModule):
    def __init__(self, args):
        super().__init__()
        self.args = args
        self.net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))

    def configure_model(self):
        pass

    def _fault(self):
        a, rank, step = self.args, self.global_rank, self.global_step
        if rank == a.sleep_rank and step == a.sleep_step:
            print(f"rank {rank} sleeps in training_step at step {step}", flush=True)
            time.sleep(3600)
        if rank == a.raise_rank and step == a.raise_step:
            raise ValueError(f"rank {rank} raises on purpose at step {step}")
        if rank == a.kill_rank and step == a.kill_step and not os.path.exists(a.marker):
            open(a.marker, "w").close()
            # the save of the step before may still be writing on a busy machine; a kill then would leave it unsealed
            # and the relaunch would start from the one before it (correctly, but not the step the test expects)
            from sprite.runtime.ckpt import durable

            assert durable.drain(120), "the save in flight was not sealed in 120 s"
            print(f"rank {rank} kills itself at step {step}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    def training_step(self, batch, batch_idx):
        self._fault()
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", nn.functional.mse_loss(self.net(x), y), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def loader(rows):
    x = torch.randn(rows, 8, generator=torch.Generator().manual_seed(0))
    return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)


def main():
    p = argparse.ArgumentParser()
    for name in ("sleep", "kill", "raise"):
        p.add_argument(f"--{name}-rank", type=int, default=-1)
        p.add_argument(f"--{name}-step", type=int, default=-1)
    p.add_argument("--marker", default="killed-once")
    p.add_argument("--max-steps", type=int, default=8)
    p.add_argument("--guarded-save")
    p.add_argument("--strategy")
    p.add_argument("--checkpoint-dir")
    a = p.parse_args()
    L.seed_everything(0, verbose=False)
    kwargs = {"strategy": a.strategy} if a.strategy else {}
    if a.checkpoint_dir:
        kwargs["callbacks"] = [ModelCheckpoint(dirpath=a.checkpoint_dir, every_n_train_steps=2, save_top_k=-1)]
    trainer = L.Trainer(max_steps=a.max_steps, val_check_interval=4, logger=False,
                        enable_checkpointing=bool(a.checkpoint_dir), enable_progress_bar=False,
                        enable_model_summary=False, **kwargs)
    trainer.fit(Model(a), loader(64), loader(16))
    if a.guarded_save and trainer.is_global_zero:
        trainer.save_checkpoint(a.guarded_save)
    print(f"rank {trainer.global_rank} finished at step {trainer.global_step}", flush=True)


if __name__ == "__main__":
    main()
