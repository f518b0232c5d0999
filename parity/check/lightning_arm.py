"""The ddp and fsdp arms: a plain Lightning fit over the launched world, recording every step.

Rows come from our own DistributedSampler(shuffle=False) (use_distributed_sampler=False), so rank r trains
exactly the rows the split arms replay for shard r. Gradients are recorded in on_before_optimizer_step
(after synchronisation, before clipping), the post-clip norm in configure_gradient_clipping, and parameters
after every update.
"""

from __future__ import annotations

import pathlib

import lightning as L
import torch
from torch.utils.data import DataLoader, DistributedSampler

from sprite.parity import probes, recipe, store
from sprite.parity.check.injector import Injector
from sprite.parity.check.recorder import Recorder
from sprite.parity.settings import Settings
from sprite.parity.strategies import communication, trainer_kwargs
from sprite.runtime.shard import shard_model


class ArmModule(L.LightningModule):
    """Trains the recipe with SGD; Lightning's automatic optimization clips at settings.clip."""

    def __init__(self, arm: str, fault: str | None, settings: Settings, target: pathlib.Path, meta: dict):
        super().__init__()
        self.arm, self.fault, self.settings, self.target, self.meta = arm, fault, settings, target, meta
        self.net = recipe.build_model(settings)
        self.rows = recipe.Rows(*recipe.make_rows(settings, self.net.backbone.config.vocab_size))
        self.step_index, self.pending = 0, None

    def configure_model(self) -> None:
        if self.arm == "fsdp":  # each decoder layer, then the root; default fp32 policy
            shard_model(self.net, self.device_mesh["data_parallel"])

    def train_dataloader(self) -> DataLoader:
        world = self.trainer.world_size
        sampler = DistributedSampler(self.rows, num_replicas=world, rank=self.global_rank, shuffle=False)
        return DataLoader(self.rows, batch_size=self.settings.global_batch // world, sampler=sampler)

    def configure_optimizers(self):
        return torch.optim.SGD([p for p in self.net.parameters() if p.requires_grad], lr=self.settings.lr)

    def on_fit_start(self) -> None:
        world, rank = self.trainer.world_size, self.global_rank
        bf16 = self.settings.precision == "bf16-mixed"
        probe = probes.LinearProbe(self.net, torch.bfloat16 if bf16 else torch.float32, autocast=bf16)
        meta = {**self.meta, "world": world, "rank": rank, "device": self.device.type, "bf16_autocast": bf16}
        self.recorder = Recorder(self.target, rank, meta, self.net, probe)
        self.params = self.recorder.params
        self.injector = Injector(self.fault, rank, world, self.settings.steps)
        self.injector.watch_adapter(list(self.net.named_parameters()))
        self.injector.patch_backbone(self.net, self.device.type)
        # Lightning unwraps the DDP model before on_fit_end, so the wrapper is inspected here.
        self.comm = communication(self.trainer.strategy, self.net)

    def training_step(self, batch, batch_idx):
        rows, ids, labels = batch
        loss = recipe.row_loss(self.net, ids, labels)
        self.pending = ([int(r) for r in rows], float(loss.detach()))
        return self.injector.scale_loss(loss)

    def on_before_optimizer_step(self, optimizer) -> None:
        self.injector.after_sync(self.params)
        rows, loss = self.pending
        self.recorder.before_clip(self.step_index, [rows], loss)

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
        self.clip_gradients(optimizer, gradient_clip_val, gradient_clip_algorithm)
        self.recorder.after_clip()
        self.injector.before_update(self.params, self.step_index)

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        self.injector.after_update(self.params)
        self.recorder.after_update()
        self.step_index += 1

    def on_fit_end(self) -> None:
        self.recorder.finish(self.comm)
        self.trainer.strategy.barrier()
        if self.global_rank == 0:
            store.seal(self.target, self.trainer.world_size)
        self.trainer.strategy.barrier()


def run(arm: str, fault: str | None, settings: Settings, target: pathlib.Path, meta: dict) -> None:
    """Fits the ddp or fsdp arm over the launched world and writes every rank's record.

    Raises ResultError if the namespace already holds a result (checked on every rank before training).
    """
    module = ArmModule(arm, fault, settings, target, meta)
    trainer = L.Trainer(
        **trainer_kwargs(arm, settings),
        max_steps=settings.steps, use_distributed_sampler=False, gradient_clip_val=settings.clip,
        gradient_clip_algorithm="norm", logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, num_sanity_val_steps=0,
    )
    trainer.fit(module)
