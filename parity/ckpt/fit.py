"""One fit of one role: the Trainer, the sealed end-of-epoch saves, and the verified load.

Runs inside ``python -m sprite.runtime``, which fills the Trainer's accelerator, devices, nodes, precision and
strategy from the launch; for FSDP2 the fit passes sprite's FSDP2Strategy with the checkpoint format it writes.
"""

from __future__ import annotations

import lightning as L
from lightning.pytorch.callbacks import Callback

from sprite import integrity
from sprite.errors import UsageError
from sprite.parity.ckpt.module import CkptModule, FitPlan
from sprite.parity.ckpt.saving import save_sealed
from sprite.parity.ckpt.settings import CkptSettings
from sprite.parity.store import ResultError
from sprite.parity.strategies import under_sprite_runtime


class EpochEndSaves(Callback):
    """Saves the plan's epoch-1 checkpoints and its final one, each into a new name, sealed (see ckpt_saving)."""

    def __init__(self, plan: FitPlan, settings: CkptSettings):
        self.plan, self.settings = plan, settings

    def on_train_epoch_end(self, trainer, module) -> None:
        epoch = trainer.current_epoch + 1
        todo = self.plan.saves if epoch == 1 else ()
        if epoch == self.settings.epochs and self.plan.save_final:
            todo = (self.plan.save_final,)
        for rel, sharded in todo:
            if hasattr(trainer.strategy, "_save_distributed_checkpoint"):
                # The format is this attribute of Lightning 2.6.6's ModelParallelStrategy (pytorch/strategies/
                # model_parallel.py:94); setting it per save lets one FSDP2 state be written in both formats.
                trainer.strategy._save_distributed_checkpoint = sharded
            module._saving = rel
            manifest_sha256 = save_sealed(trainer, self.plan.out / rel)
            if trainer.global_rank == 0:
                module.saves[rel]["manifest_sha256"] = manifest_sha256


def verified(plan: FitPlan) -> dict:
    """The checkpoint the plan loads, verified against its manifest: its path and the manifest's sha256.

    Raises ResultError when the checkpoint is missing, unsealed or differs from its manifest.
    """
    path = plan.out / plan.load
    verdict = integrity.verify(path)
    if not verdict.valid:
        raise ResultError(f"Checkpoint {plan.load} is not valid: {verdict.reason}.",
                          "The role that writes it failed, or the file was changed after the save.",
                          "Run the check again into a fresh --out.")
    return {"path": plan.load, "manifest_sha256": integrity.sha256_file(integrity.manifest_path(path))}


def fit(settings: CkptSettings, plan: FitPlan, strategy: str) -> None:
    """Runs one fit of ``plan`` under the launched world (``strategy``: single, ddp or fsdp).

    Raises UsageError outside ``python -m sprite.runtime``; ResultError for an invalid checkpoint to load;
    IntegrityError when a result or checkpoint name is taken.
    """
    if not under_sprite_runtime():
        raise UsageError("The checkpoint-check worker ran outside sprite's runtime.",
                         "It was started directly, not by `sprite ckpt-check`.", "Run `sprite ckpt-check`.")
    if (plan.out / plan.target).exists():
        raise integrity.IntegrityError(f"Result {plan.target} exists already; refusing to record over it.",
                                       "The directory was used by an earlier run.", "Pass a fresh --out.")
    if plan.load:
        plan.meta["loaded"] = verified(plan)
    kwargs = {}
    if strategy == "fsdp":
        from sprite.runtime.fsdp2 import FSDP2Strategy

        sharded = plan.save_final[1] if plan.save_final else True
        kwargs["strategy"] = FSDP2Strategy(save_distributed_checkpoint=sharded)
    module = CkptModule(settings, plan, fsdp=strategy == "fsdp")
    trainer = L.Trainer(
        **kwargs, max_epochs=settings.epochs + int(plan.stop_at_start), use_distributed_sampler=False,
        gradient_clip_val=settings.clip, gradient_clip_algorithm="norm", logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
        callbacks=[EpochEndSaves(plan, settings)],
    )
    trainer.fit(module, ckpt_path=str(plan.out / plan.load) if plan.load else None)
