"""The LightningModule every checkpoint role fits, and what one fit of a role does (``FitPlan``).

It records every step (loop position, rows, loss, LR, pre-clip global norm), captures the state inside every
save (``on_save_checkpoint``) and after the restore (``on_train_start``, where a fault case first injects its
fault), and writes the rank's result when training ends, or just before the killed fit kills itself. Before any
load, every frozen tensor is changed, so only the checkpoint can restore it.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import signal

import lightning as L
import torch
from torch.utils.data import DataLoader, DistributedSampler

from sprite.parity import probes, recipe
from sprite.parity.ckpt import faults as ckpt_faults
from sprite.parity.ckpt import results as ckpt_results
from sprite.parity.ckpt import state as ckpt_state
from sprite.parity.ckpt.settings import CkptSettings, lr_factor
from sprite.parity.settings import Settings
from sprite.runtime.shard import shard_model


@dataclasses.dataclass
class FitPlan:
    """One fit: where it records, what it loads and saves (paths relative to ``out``), what it injects."""

    out: pathlib.Path
    target: str
    meta: dict
    load: str | None = None
    saves: tuple[tuple[str, bool], ...] = ()  # (path, sharded) written at the end of epoch 1
    save_final: tuple[str, bool] | None = None  # written at the end of the last epoch
    kill_after: int | None = None  # steps after which the fit kills itself
    fault: str | None = None
    stop_at_start: bool = False  # a reload: restore, capture, train nothing
    gather: bool = False  # full-value digests too (reshard and export compare across world sizes)


def recipe_settings(settings: CkptSettings) -> Settings:
    """The parity recipe's settings for this check's model and rows (one epoch's rows)."""
    return Settings(precision=settings.precision, devices=settings.devices, nodes=settings.nodes, model=settings.model,
                    accelerator=settings.accelerator, seed=settings.seed, steps=settings.steps_per_epoch,
                    seq_len=settings.seq_len, global_batch=settings.global_batch)


class CkptModule(L.LightningModule):
    """The parity recipe trained with AdamW, a per-step LambdaLR and global-norm clipping (by the Trainer)."""

    def __init__(self, settings: CkptSettings, plan: FitPlan, fsdp: bool):
        super().__init__()
        self.settings, self.plan, self.fsdp = settings, plan, fsdp
        self.net = recipe.build_model(recipe_settings(settings))
        self.rows = recipe.Rows(*recipe.make_rows(recipe_settings(settings), self.net.backbone.config.vocab_size))
        self.frozen_before_load = None
        if plan.load:
            with torch.no_grad():
                for param in self.net.parameters():
                    if not param.requires_grad:
                        param.add_(1.0)
            self.frozen_before_load = {n: ckpt_state.digest(p) for n, p in self.net.named_parameters()
                                       if not p.requires_grad}
        self.steps: list[dict] = []
        self.saves: dict[str, dict] = {}  # checkpoint path -> the state captured inside that save
        self._saving: str | None = None  # the path EpochEndSaves is saving to
        self.restored: dict | None = None
        self.arrays: dict = {}
        self.pending: dict = {}

    def configure_model(self) -> None:
        if self.fsdp:  # each decoder layer, then the root; default fp32 policy
            shard_model(self.net, self.device_mesh["data_parallel"])

    def train_dataloader(self) -> DataLoader:
        world = self.trainer.world_size
        sampler = DistributedSampler(self.rows, num_replicas=world, rank=self.global_rank, shuffle=True,
                                     seed=self.settings.seed)
        return DataLoader(self.rows, batch_size=self.settings.global_batch // world, sampler=sampler)

    def configure_optimizers(self):
        params = [p for p in self.net.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=self.settings.lr)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    def _loop(self, at_epoch_end: bool) -> dict:
        return {"global_step": self.trainer.global_step, "next_epoch": self.trainer.current_epoch + int(at_epoch_end)}

    def _capture(self, at_epoch_end: bool) -> dict:
        scheduler = self.lr_schedulers()
        return ckpt_state.capture(self.net, self.optimizers().optimizer, scheduler, self._loop(at_epoch_end),
                                  self.plan.gather)

    def on_train_start(self) -> None:
        if self.plan.load:
            ckpt_faults.inject(self.plan.fault, self.net, self.optimizers().optimizer, self.lr_schedulers(),
                               self.global_rank)
            self.restored = self._capture(at_epoch_end=False)
        if self.plan.stop_at_start:
            self.trainer.should_stop = True

    def training_step(self, batch, batch_idx):
        rows, ids, labels = batch
        loss = recipe.row_loss(self.net, ids, labels)
        self.pending = {"global_step": self.trainer.global_step, "epoch": self.trainer.current_epoch,
                        "batch_idx": batch_idx, "rows": [int(r) for r in rows], "loss": float(loss.detach())}
        return loss

    def on_before_optimizer_step(self, optimizer) -> None:
        grads = [probes.full(p.grad) for p in self.net.parameters() if p.requires_grad and p.grad is not None]
        self.pending["pre_norm"] = probes.global_norm(grads) if grads else None
        self.pending["lr"] = [group["lr"] for group in optimizer.param_groups]

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        self.steps.append(self.pending)
        if self.plan.kill_after is not None and len(self.steps) == self.plan.kill_after:
            self._finish()
            os.kill(os.getpid(), signal.SIGKILL)  # no teardown, no flush: as a node failure would end it

    def on_train_epoch_end(self) -> None:
        if self.trainer.current_epoch == 0 and not self.plan.load:
            self.arrays.update(ckpt_state.arrays(self.net, self.optimizers().optimizer, "epoch1"))

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        self.saves[self._saving] = {"state": self._capture(at_epoch_end=True)}

    def on_train_end(self) -> None:
        if self.plan.kill_after is None:
            if not self.plan.stop_at_start:
                self.arrays.update(ckpt_state.arrays(self.net, self.optimizers().optimizer, "end"))
            self._finish()

    def _finish(self) -> None:
        record = {"meta": {**self.plan.meta, "world": self.trainer.world_size, "rank": self.global_rank,
                           "device": str(self.device)},
                  "steps": self.steps, "saves": self.saves, "restored": self.restored,
                  "loaded": self.plan.load, "killed_after": self.plan.kill_after,
                  "frozen_before_load": self.frozen_before_load}
        ckpt_results.write(self.plan.out, self.plan.target, self.trainer.strategy, record,
                           self.arrays if self.global_rank == 0 else {})
