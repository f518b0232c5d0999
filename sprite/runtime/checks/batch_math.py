"""How many samples one optimizer step sees across the world, and where an epoch's end changes it.

Pure arithmetic over what the Trainer and its training loader say. Lightning steps the optimizer on an epoch's
final batch even when the accumulation window is not full (Lightning 2.6.6 loops/training_epoch_loop.py:451) and
still divides that window's loss by ``accumulate_grad_batches`` (loops/optimization/automatic.py:83).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class BatchFacts:
    """What one rank's training loader and the Trainer say about a step; ``None``: not known."""

    local: Optional[int]  # samples in one batch on one rank
    replicas: int  # data-parallel ranks (the world size unless tensor parallelism shares a batch)
    accumulation: int  # Trainer(accumulate_grad_batches)
    batches: Optional[int] = None  # batches per rank per epoch the loop runs (None: unknown or unbounded)
    samples: Optional[int] = None  # samples per rank per epoch, when the loop runs the whole loader
    drop_last: bool = False  # the loader drops a short last batch
    repeated: int = 0  # training samples DistributedSampler repeats each epoch to even the ranks

    @property
    def global_batch(self) -> Optional[int]:
        """Samples in one full optimizer step over the world: local x replicas x accumulation."""
        return None if self.local is None else self.local * self.replicas * self.accumulation

    @property
    def last_batch(self) -> Optional[int]:
        """Samples in each rank's last batch of an epoch (``local`` when the epoch ends on a full batch)."""
        if self.local is None or self.samples is None or self.drop_last or self.samples % self.local == 0:
            return self.local
        return self.samples % self.local

    @property
    def final_window(self) -> Optional[int]:
        """Batches in the epoch's last accumulation window (``accumulation`` when it is full)."""
        if self.batches is None:
            return None
        return self.batches % self.accumulation or self.accumulation

    @property
    def final_step(self) -> Optional[int]:
        """Samples the epoch's last optimizer step sees over the world."""
        if self.local is None or self.final_window is None or self.last_batch is None:
            return None
        return ((self.final_window - 1) * self.local + self.last_batch) * self.replicas


def repeated_samples(length: int, world: int) -> int:
    """Samples DistributedSampler (drop_last=False) adds so ``length`` divides evenly over ``world`` ranks."""
    return -length % world


def batch_lines(facts: BatchFacts, world: int) -> list[str]:
    """The world block's ``batch`` line and, when the end of an epoch changes the step, its ``epoch`` line."""
    noun = "rank" if facts.replicas == world else "data-parallel group"
    ranks = f"{facts.replicas} {noun}{'s' if facts.replicas != 1 else ''}"
    if facts.global_batch is None:
        return [f"batch      unknown per rank (no single training loader with a batch size) x {ranks} x "
                f"{facts.accumulation} accumulated"]
    lines = [f"batch      {facts.local} per rank x {ranks} x {facts.accumulation} accumulated = "
             f"{facts.global_batch} samples per optimizer step"]
    notes = [] if facts.batches is None else [f"{facts.batches} batch(es) per rank"]
    if facts.final_step not in (None, facts.global_batch):
        parts = []
        if facts.last_batch != facts.local:
            parts.append(f"a last batch of {facts.last_batch} samples per rank")
        if facts.final_window != facts.accumulation:
            parts.append(f"a last window of {facts.final_window} of {facts.accumulation} batches (Lightning still"
                         f" divides its loss by {facts.accumulation})")
        notes.append(f"the last step sees {facts.final_step} samples, not {facts.global_batch}: "
                     + " and ".join(parts))
    if facts.repeated:
        notes.append(f"the sampler repeats {facts.repeated} sample(s) to even the ranks")
    if len(notes) > 1:
        lines.append("epoch      " + "; ".join(notes))
    return lines
