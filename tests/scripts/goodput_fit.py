"""A 2-rank Lightning fit with a fixed step time, for goodput's ground truth (tests/test_goodput_runs.py).

Every step sleeps ``--step-seconds``; rank 0 appends ``{"step", "t", "attempt"}`` (wall time at the start of each
training step) to OUT/steps.jsonl. One fault, fired once (the file ``--once`` is made when it fires):
``--kill-at-step K`` SIGKILLs rank 1 at the start of step K; ``--hang-at-step K`` makes every rank sleep there
(rank 0 writes OUT/hang.json with the time); ``--preempt-at-step K`` sends SIGUSR1 to rank 0 (sprite's
preemption signal). ``--every N``: a ModelCheckpoint every N steps; 0: ``enable_checkpointing=False``.
"""

import argparse
import json
import os
import signal
import time

import lightning as L
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Net(L.LightningModule):
    def __init__(self, args):
        super().__init__()
        self.net = nn.Linear(4, 1)
        self.args = args

    def training_step(self, batch, batch_idx):
        args, step, rank = self.args, self.global_step, self.global_rank
        if rank == 0:
            with open(os.path.join(args.out, "steps.jsonl"), "a") as sink:
                sink.write(json.dumps({"step": step, "t": time.time(),
                                       "attempt": os.environ.get("SPRITE_ATTEMPT", "")}) + "\n")
        if not os.path.exists(args.once):
            self.fault(args, step, rank)
        time.sleep(args.step_seconds)
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    @staticmethod
    def fault(args, step, rank):
        if step == args.kill_at_step and rank == 1:
            open(args.once, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        if step == args.preempt_at_step and rank == 0:
            open(args.once, "w").close()
            os.kill(os.getpid(), signal.SIGUSR1)
        if step == args.hang_at_step:
            if rank == 0:
                open(args.once, "w").close()
                with open(os.path.join(args.out, "hang.json"), "w") as sink:
                    json.dump({"step": step, "t": time.time()}, sink)
            time.sleep(600)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--once", required=True)
    parser.add_argument("--ckpt-dir")
    parser.add_argument("--max-steps", type=int, default=20)
    parser.add_argument("--every", type=int, default=0)
    parser.add_argument("--step-seconds", type=float, default=0.25)
    parser.add_argument("--kill-at-step", type=int, default=-1)
    parser.add_argument("--hang-at-step", type=int, default=-1)
    parser.add_argument("--preempt-at-step", type=int, default=-1)
    parser.add_argument("--root", default=None)
    args = parser.parse_args()

    L.seed_everything(0, verbose=False)
    x = torch.randn(256, 4, generator=torch.Generator().manual_seed(1))
    data = TensorDataset(x, x.sum(dim=1, keepdim=True))
    extra = {"enable_checkpointing": False} if args.every == 0 else \
        {"callbacks": [ModelCheckpoint(dirpath=args.ckpt_dir, every_n_train_steps=args.every, save_top_k=-1)]}
    trainer = L.Trainer(max_steps=args.max_steps, logger=False, enable_progress_bar=False,
                        enable_model_summary=False, default_root_dir=args.root, **extra)
    trainer.fit(Net(args), DataLoader(data, batch_size=4))


if __name__ == "__main__":
    main()
