"""Checkpoints on a clock (``--checkpoint-every``) and the first-step record that goodput needs.

Every fit of a launch with a run folder gets a :class:`Cadence` callback. At the first training step of a process
rank 0 appends ``first_step`` (attempt, step, wall time) to the audit trail: where an attempt's start-up (or its
restart) ends and its training begins (``sprite runs goodput``).

With ``SPRITE_CHECKPOINT_EVERY`` (seconds, or ``auto``) it saves through ``Trainer.save_checkpoint`` (sealed, as
every save is) at an optimizer-step boundary soon after each interval (below), whether or not the script has a
ModelCheckpoint and even with ``enable_checkpointing=False``, into the script's checkpoint folder (its first
ModelCheckpoint's, else ``<default_root_dir>/checkpoints``), where ``--resume auto`` looks. Only rank 0's clock
decides; every rank learns the decision from one small MAX all-reduce (a world of one rank skips it), and not at
every step: the ranks agree about twenty times an interval (``spacing``, from the slowest rank's step time and
rank 0's interval, both agreed in the same all-reduce, so every rank checks at the same optimizer steps). A
save thus comes at the first agreement after the interval, at most about a twentieth of it late, and the device
synchronisation an agreement costs (preempt.py: ~15% of a launch-bound H200 step) is paid only at those steps. It keeps the newest ``SPRITE_KEEP`` (default 2) of the clock
checkpoints of this run (this process's, and the sealed ones earlier attempts recorded in the run's audit trail),
and removes older ones only after the newer is sealed (``durable.remove_later``); nothing else is ever removed.

``auto``: the interval is Young/Daly's sqrt(2 x C x MTBF) with C the measured stall of the first save (made at the
first step boundary) and MTBF from ``SPRITE_MTBF``; it is recomputed whenever a save's stall differs from the C in
use by more than half, and each choice is an audit record ``checkpoint_interval`` (seconds, save_seconds,
mtbf_hours).
"""

from __future__ import annotations

import math
import os
import shutil
import time
from pathlib import Path

from lightning.pytorch import Callback

from sprite import contract
from sprite.errors import SpriteError, UsageError
from sprite.runtime import trail

PREFIX = "sprite-every"  # the names of the checkpoints sprite saves on its clock (and may remove with --keep)
KEEP = 2


def young_daly(save_seconds: float, mtbf_seconds: float) -> float:
    """The checkpoint interval that minimises expected lost work plus save cost: sqrt(2 x C x MTBF) (Young 1974;
    Daly 2006's first-order term)."""
    return math.sqrt(2.0 * max(save_seconds, 0.0) * mtbf_seconds)


def settings(env) -> tuple[float | str | None, float | None, int]:
    """(interval seconds, "auto" or None; MTBF seconds or None; keep) from the contract. Raises UsageError on a
    malformed value (sprite run never exports one)."""
    every = env.get(contract.CHECKPOINT_EVERY, "").strip()
    mtbf = env.get(contract.MTBF, "").strip()
    keep = env.get(contract.KEEP, "").strip() or str(KEEP)
    try:
        interval = None if not every else "auto" if every == "auto" else float(every)
        mtbf_s = float(mtbf) if mtbf else None
        kept = int(keep)
    except ValueError:
        interval, mtbf_s, kept = -1.0, None, 0
    if interval == "auto" and not mtbf_s or isinstance(interval, float) and not interval > 0 or kept < 1 or \
            mtbf_s is not None and not mtbf_s > 0:
        raise UsageError(f"{contract.CHECKPOINT_EVERY}={every!r} {contract.MTBF}={mtbf!r} {contract.KEEP}={keep!r}"
                         " is not a valid checkpoint cadence.", "It was set by hand, not by sprite run.",
                         "Use sprite run --checkpoint-every DURATION|auto [--mtbf DURATION] [--keep N].")
    return interval, mtbf_s, kept


CHECKS_PER_INTERVAL = 20  # agreements per interval at most: a save comes at most 1/20 of the interval late
MAX_SPACING = 1000  # optimizer steps between two agreements at most


def spacing(interval: float, step_seconds: float) -> int:
    """Optimizer steps between two agreements on whether a save is due: about a twentieth of the interval, at
    least every step. Computed from values every rank agreed on, so every rank checks at the same steps."""
    if not interval > 0 or not step_seconds > 0:
        return 1
    return max(1, min(MAX_SPACING, int(interval / (CHECKS_PER_INTERVAL * step_seconds))))


def _attempt(env) -> int:
    value = env.get(contract.ATTEMPT, "")
    return int(value) if value.isascii() and value.isdigit() else 0


class Cadence(Callback):
    """Records the first training step; saves on a clock when asked (module docstring)."""

    def __init__(self, env=os.environ) -> None:
        self.every, self.mtbf, self.keep = settings(env)
        self.attempt = _attempt(env)
        self.interval = self.every if isinstance(self.every, float) else 0.0  # auto: 0 until the first save
        self.cost = None  # auto: the save stall C the interval was computed from
        self.started = False
        self.last = 0.0
        self.checked_step = -1
        self.steps, self.check_every, self.mark = 0, 1, 0.0  # optimizer steps since the last agreement, between two
        self.mine: list[str] = []  # this run's clock checkpoints, oldest first
        self.seeded = False

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if self.started:
            return
        self.started, self.last, self.checked_step = True, time.time(), trainer.global_step
        self.mark = self.last
        if trainer.is_global_zero:
            trail.audit("first_step", attempt=self.attempt, step=trainer.global_step, wall=round(self.last, 4))

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.every is None or trainer.global_step == self.checked_step:
            return  # no cadence, or no optimizer step since the last check (gradient accumulation)
        self.checked_step = trainer.global_step
        self.steps += 1
        if self.steps < self.check_every:
            return
        now = time.time()
        step_seconds, self.mark, self.steps = (now - self.mark) / self.steps, now, 0
        due = trainer.is_global_zero and now - self.last >= self.interval
        due, step_seconds, interval = self._agree(trainer, due, step_seconds,
                                                  self.interval if trainer.is_global_zero else 0.0)
        self.check_every = spacing(interval, step_seconds)
        if not due:
            return
        from sprite.runtime.preempt import checkpoint_folder

        path = self._name(trainer, Path(checkpoint_folder(trainer)))
        before = time.time()
        trainer.save_checkpoint(path)
        self.last = self.mark = time.time()
        self.mine.append(path)
        if trainer.is_global_zero and self.every == "auto":
            self._retune(self.last - before)
        self._prune(trainer)

    def _name(self, trainer, folder: Path) -> str:
        """Where this save goes, rank 0's pick on every rank: ``sprite-every-step=N.ckpt``, or ``...-vK.ckpt`` where
        that name holds a checkpoint this run did not save (another run's, in the same folder under ``--resume
        never``): a save replaces only this run's own."""
        from sprite.runtime.ckpt.seal import free_name

        base = str(folder / f"{PREFIX}-step={trainer.global_step}")
        return free_name(trainer, base, lambda: {*self.mine, *self._earlier(folder)})

    def _retune(self, stall: float) -> None:
        """Rank 0, auto: a new interval from this save's stall when it is the first or differs by over half."""
        if self.cost is not None and abs(stall - self.cost) <= 0.5 * self.cost:
            return
        self.cost, self.interval = stall, young_daly(stall, self.mtbf)
        trail.audit("checkpoint_interval", attempt=self.attempt, seconds=round(self.interval, 4),
                    save_seconds=round(stall, 4), mtbf_hours=round(self.mtbf / 3600, 6))
        trail.say(f"checkpoint every {self.interval:.1f} s (Young/Daly: save stall {stall:.3f} s, MTBF "
                  f"{self.mtbf / 3600:.2f} h)")

    def _earlier(self, folder: Path) -> list[str]:
        """Clock checkpoints earlier attempts of this run saved in ``folder`` and that still exist, oldest first
        (from the run's audit trail: sprite's own saves, never another file)."""
        from sprite.integrity import audit

        run_dir = os.environ.get(contract.RUN_DIR, "").strip()
        try:
            records = audit.read(os.path.join(run_dir, trail.AUDIT_NAME)) if run_dir else []
        except (OSError, ValueError, SpriteError):  # unreadable or damaged: no earlier save is taken for ours
            return []
        paths = [r.get("path") for r in records if r.get("kind") == "checkpoint_written" and r.get("verified")]
        return [p for p in dict.fromkeys(paths) if isinstance(p, str) and Path(p).parent == folder and
                Path(p).name.startswith(PREFIX + "-") and os.path.lexists(p)]

    def _prune(self, trainer) -> None:
        """Remove this run's own clock checkpoints beyond the newest ``keep``, once the newest is sealed."""
        from sprite import integrity
        from sprite.runtime.ckpt import durable

        if not self.seeded and trainer.is_global_zero:  # the first save of this process
            self.seeded = True
            self.mine[:0] = [p for p in self._earlier(Path(self.mine[0]).parent) if p != self.mine[0]]
        while len(self.mine) > self.keep:
            old = self.mine.pop(0)

            def remove(old=old):
                for name in (old, str(integrity.manifest_path(Path(old)))):
                    if os.path.isdir(name) and not os.path.islink(name):
                        shutil.rmtree(name)  # a sharded save's folder
                    elif os.path.lexists(name):
                        os.unlink(name)

            if trainer.is_global_zero:
                durable.remove_later(old, remove)

    @staticmethod
    def _agree(trainer, due: bool, step_seconds: float, interval: float) -> tuple[bool, float, float]:
        """Rank 0's decision and interval, and the slowest rank's step time, the same on every rank: one
        three-element MAX all-reduce (a world of one rank takes its own)."""
        if trainer.world_size == 1:
            return due, step_seconds, interval
        import torch
        import torch.distributed as dist

        values = torch.tensor([float(due), step_seconds, interval], dtype=torch.float32,
                              device=trainer.strategy.root_device)
        dist.all_reduce(values, op=dist.ReduceOp.MAX)
        due_, step_, interval_ = values.tolist()
        return due_ > 0, step_, interval_


def callbacks(env=os.environ) -> list:
    """A Cadence for a launch with a run folder (``SPRITE_RUN_DIR``), else none. Raises UsageError as
    :func:`settings`."""
    return [Cadence(env)] if env.get(contract.RUN_DIR, "").strip() else []
