"""A plain Lightning script for sprite's checkpoint tests: dropout, shuffled data, ModelCheckpoint every N steps,
and with ``--count-batches`` a buffer its own ``on_train_batch_end`` counts batches in (Lightning runs that hook
after every callback, so a ModelCheckpoint save of a step does not hold that step's count).

Nothing here knows about sprite's manifests or resume: sprite's runtime seals the checkpoints and passes
``--resume`` to ``Trainer.fit``. Each rank appends ``{"step", "loss", "t"}`` per step to OUT/losses-<tag>-rank<N>.jsonl;
rank 0 saves the final trainable weights to OUT/final-<tag>.pt. ``--crash-at-save K`` makes rank 0 write half of
its K-th checkpoint file (counted in this process) and SIGKILL itself: a save cut short in the middle.
``--hold-at-step K --hold-dir DIR`` makes every rank, at the start of global step K (its first batch, under
``--accumulate N``), write DIR/held-rank<N> and wait for DIR/go: a test sends its signal while the ranks are known
to be at that step. ``--grow-at-step K``: see
:func:`grow`.
"""

import argparse
import io
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
    def __init__(self, out: str, tag: str, hold: tuple = (-1, ""), count_batches: bool = False, grow_at: int = -1):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Dropout(0.3), nn.Linear(32, 1))
        self.out, self.tag, self.hold, self.grow_at = out, tag, hold, grow_at
        if count_batches:  # kept by the module's own on_train_batch_end
            self.register_buffer("batches_seen", torch.zeros((), dtype=torch.long))

    def training_step(self, batch, batch_idx):
        if self.global_step == self.hold[0]:
            hold_here(self.hold[1], self.global_rank)
        if self.global_step == self.grow_at and not hasattr(self, "grown"):
            grow(self)
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("progress", float(self.global_step))
        path = os.path.join(self.out, f"losses-{self.tag}-rank{self.global_rank}.jsonl")
        with open(path, "a") as sink:
            sink.write(json.dumps({"step": self.global_step, "batch": batch_idx, "loss": float(loss.detach()).hex(),
                                   "t": time.perf_counter()}) + "\n")
        return loss

    def on_train_batch_end(self, outputs, batch, batch_idx):
        if hasattr(self, "batches_seen"):
            self.batches_seen += 1

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=0.01)


def grow(module) -> None:
    """The state grows mid-fit (a buffer made late, as an average of the weights started after N steps is), and,
    a fake of /dev/shm filled up meanwhile, sprite's ``dcp_write.shm_free`` reports 0 bytes free in this rank."""
    from sprite.runtime.ckpt import dcp_write

    module.register_buffer("grown", torch.zeros(4096))
    dcp_write.shm_free = lambda: 0


def hold_here(folder: str, rank: int, limit: float = 300.0) -> None:
    """Say this rank is at the hold step, then wait for the test's go file."""
    open(os.path.join(folder, f"held-rank{rank}"), "w").close()
    deadline = time.monotonic() + limit
    while not os.path.exists(os.path.join(folder, "go")):
        if time.monotonic() > deadline:
            raise RuntimeError(f"no go file in {folder} after {limit} s")
        time.sleep(0.05)


def crash_at_save(trainer, count: int) -> None:
    """Rank 0's K-th save writes half the file at its final name, then the process is SIGKILLed."""
    io_plugin, original, seen = trainer.strategy.checkpoint_io, trainer.strategy.checkpoint_io.save_checkpoint, [0]

    def save(checkpoint, path, storage_options=None):
        seen[0] += 1
        if seen[0] != count:
            return original(checkpoint, path, storage_options=storage_options)
        buffer = io.BytesIO()
        torch.save(checkpoint, buffer)
        with open(path, "wb") as handle:
            handle.write(buffer.getvalue()[: len(buffer.getvalue()) // 2])
        os.kill(os.getpid(), signal.SIGKILL)

    io_plugin.save_checkpoint = save


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--tag", required=True)
    parser.add_argument("--ckpt-dir")
    parser.add_argument("--max-steps", type=int, default=20)
    parser.add_argument("--every", type=int, default=3)
    parser.add_argument("--crash-at-save", type=int, default=0)
    parser.add_argument("--top-k", type=int, default=-1, help="keep only the K newest (monitor: progress)")
    parser.add_argument("--save-last", action="store_true")
    parser.add_argument("--save-after-fit", default="", help="trainer.save_checkpoint(PATH) once fit returned")
    parser.add_argument("--grow-at-step", type=int, default=-1,
                        help="at this global step a buffer joins the state and /dev/shm looks full to sprite (a fake)")
    parser.add_argument("--full-state", action="store_true", help="FSDP2: one full-state file, not a DCP folder")
    parser.add_argument("--count-batches", action="store_true", help="a buffer the module's own hook counts in")
    parser.add_argument("--accumulate", type=int, default=1, help="Trainer(accumulate_grad_batches=N)")
    parser.add_argument("--hold-at-step", type=int, default=-1)
    parser.add_argument("--hold-dir", default="")
    parser.add_argument("--usr1-taken-beneath-python", action="store_true",
                        help="ignore SIGUSR1 through libc's signal(), as a C library that installs its own handler"
                             " does: Python's signal.getsignal still names the old handler")
    parser.add_argument("--random-sampler", action="store_true",
                        help="keep the DataLoader's RandomSampler on every rank (its permutation comes from the"
                             " global torch generator) instead of Lightning's DistributedSampler")
    args = parser.parse_args()
    if args.usr1_taken_beneath_python:
        import ctypes

        ctypes.CDLL(None).signal(signal.SIGUSR1, ctypes.c_void_p(1))  # SIG_IGN, behind Python's back

    L.seed_everything(0, verbose=False)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(64, 8, generator=gen)
    data = TensorDataset(x, x.sum(dim=1, keepdim=True).sin())
    model = Net(args.out, args.tag, (args.hold_at_step, args.hold_dir), args.count_batches, args.grow_at_step)
    checkpoints = ModelCheckpoint(dirpath=args.ckpt_dir, every_n_train_steps=args.every, save_top_k=args.top_k,
                                  monitor="progress" if args.top_k > 0 else None, mode="max", save_last=args.save_last)
    extra = {}
    if args.full_state:
        from sprite import FSDP2Strategy

        extra["strategy"] = FSDP2Strategy(save_distributed_checkpoint=False)
    trainer = L.Trainer(max_steps=args.max_steps, callbacks=[checkpoints], logger=False,
                        enable_progress_bar=False, enable_model_summary=False,
                        use_distributed_sampler=not args.random_sampler, accumulate_grad_batches=args.accumulate,
                        **extra)
    if args.crash_at_save and trainer.global_rank == 0:
        crash_at_save(trainer, args.crash_at_save)
    trainer.fit(model, DataLoader(data, batch_size=4, shuffle=True))
    if args.save_after_fit:  # outside any fit: no end of a fit follows to wait for it
        trainer.save_checkpoint(args.save_after_fit)
    # every rank: gathering an FSDP2 shard (a DTensor) is a collective
    weights = {k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().clone()
               for k, v in model.state_dict().items()}
    if trainer.global_rank == 0:
        torch.save(weights, os.path.join(args.out, f"final-{args.tag}.pt"))


if __name__ == "__main__":
    main()
