"""Preemption inside the ranks: on ``SPRITE_PREEMPT_SIGNAL`` checkpoint at the next step boundary and exit 75.

The handler only records the signal. After each optimizer step every rank joins one small collective, a one-element
MAX all-reduce on the strategy's device and backend: it is true when any rank has received the signal, so a rank the
signal reached late, or not at all, stops at the same step as the others. Lightning 2.6.6 already pays one such
collective every training step for SIGTERM (loops/training_epoch_loop.py:259-272, 299-300) when there is more than
one rank, so this adds one more of the same size; a world of one rank skips it and reads its own flag. The ranks
then run the LightningModule's own ``on_train_batch_end`` (this callback runs after every other callback,
ModelCheckpoint included, and before the module's hook), save through ``Trainer.save_checkpoint`` (sealed with a
manifest by ckpt_seal) into the script's checkpoint folder, where ``--resume auto`` looks, and raise
:class:`Preempted`, which ``python -m sprite.runtime`` turns into exit code ``errors.EXIT_PREEMPTED`` once every
rank has left the process group. Lightning installs a requeue handler only for its own SLURMEnvironment (Lightning
2.6.6 trainer/connectors/signal_connector.py:53), so without this a sprite rank dies of the signal.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from lightning.pytorch import Callback

from sprite.errors import EXIT_PREEMPTED
from sprite.runtime import preempt_signal
from sprite.runtime import allranks
from sprite.runtime import hooks
from sprite.runtime import trail


class Preempted(SystemExit):
    """Raised on every rank after the preemption checkpoint was saved; ends the process with exit code 75."""

    def __init__(self, checkpoint: str, step: int):
        super().__init__(EXIT_PREEMPTED)
        self.checkpoint, self.step = checkpoint, step


def checkpoint_folder(trainer) -> str:
    """Where the script's own checkpoints go (its first ModelCheckpoint's folder, resolved at setup), else
    ``<default_root_dir>/checkpoints``; ``resume.checkpoint_dirs`` searches both."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    folders = [cb.dirpath for cb in trainer.checkpoint_callbacks if isinstance(cb, ModelCheckpoint) and cb.dirpath]
    return os.fspath(folders[0]) if folders else os.path.join(trainer.default_root_dir, "checkpoints")


class PreemptCallback(Callback):
    """Agrees at each optimizer step whether any rank got the signal; if so saves, records and raises."""

    def __init__(self) -> None:
        self.checked_step = -1

    def on_train_start(self, trainer, pl_module) -> None:
        self.checked_step = trainer.global_step  # the first check comes with the first optimizer step
        preempt_signal.reinstall()  # a C library set up since the rank started may have taken the signal

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == self.checked_step:
            return  # no optimizer step since the last check (gradient accumulation): not a step boundary
        self.checked_step = trainer.global_step
        if not self._any_rank_signalled(trainer):
            return
        from lightning.pytorch.trainer import call

        signalled = allranks.gather(bool(preempt_signal.received))
        call._call_lightning_module_hook(trainer, "on_train_batch_end", outputs, batch, batch_idx)
        from sprite.runtime.ckpt.seal import free_name

        base = Path(checkpoint_folder(trainer)) / f"preempted-epoch={trainer.current_epoch}-step={trainer.global_step}"
        path = Path(free_name(trainer, str(base)))  # beside, never over, another run's preemption checkpoint
        trainer.save_checkpoint(path)
        if trainer.is_global_zero:
            ranks = [rank for rank, got in enumerate(signalled) if got]
            trail.say(f"preempted: the signal reached rank(s) {','.join(map(str, ranks))}; every rank saved "
                           f"{path} at step {trainer.global_step} and stops with exit code {EXIT_PREEMPTED}")
            trail.audit("preemption", signal=preempt_signal.name_received(), signalled_ranks=ranks,
                             step=trainer.global_step, epoch=trainer.current_epoch, checkpoint=str(path))
        raise Preempted(str(path), trainer.global_step)


    @staticmethod
    def _any_rank_signalled(trainer) -> bool:
        got = bool(preempt_signal.received)
        if trainer.world_size == 1:
            # Alone, a rank needs no agreement: the collective would only add a device synchronisation per step
            # (its .item()), ~15% of a launch-bound H200 step (FACTS.md), which Lightning pays only above 1 rank.
            return got
        # One all-reduce, not Lightning's reduce_boolean_decision: that goes through _sync_ddp, which runs a
        # barrier first (lightning/fabric/utilities/distributed.py:212); on 2 H200s with NCCL the pair cost
        # ~30 ms a step (benchmarks/preempt_resume.py, docs/runs/h200x2-2026-11-30).
        import torch
        import torch.distributed as dist

        flag = torch.tensor([int(got)], dtype=torch.int32, device=trainer.strategy.root_device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())


def _last(attach, connector) -> None:
    """Lightning's callback attachment, then this launch's PreemptCallback moved (or added) to the very end."""
    attach(connector)
    trainer = connector.trainer
    mine = [cb for cb in trainer.callbacks if isinstance(cb, PreemptCallback)] or [PreemptCallback()]
    trainer.callbacks = [cb for cb in trainer.callbacks if not isinstance(cb, PreemptCallback)] + mine[:1]


def install() -> None:
    """Give every fit a PreemptCallback, last in line (after ``preempt_signal.install`` chose a signal)."""
    from lightning.pytorch.trainer.connectors.callback_connector import _CallbackConnector

    hooks.wrap(_CallbackConnector, "_attach_model_callbacks", _last)


def exit_preempted(err: Preempted) -> int:
    """After the script was stopped by :class:`Preempted`: mark the heartbeat, leave the process group with every
    rank (rank 0, the rendezvous store's host, last) and return the exit code."""
    from sprite.contract import heartbeat
    from sprite.runtime import finish
    from sprite.runtime import beats as progress

    progress.finish(err.step, heartbeat.PREEMPTED)
    finish.finish()
    sys.stderr.flush()
    return EXIT_PREEMPTED
