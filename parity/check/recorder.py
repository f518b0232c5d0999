"""Per-step recording shared by every arm: what the criterion later reads, and nothing it computes.

Each rank records its own numbers and digests; rank 0 also keeps the full tensors (initial trainables,
pre-clip gradients and parameters after every update). For FSDP2 the full values are gathered, which is a
collective, so every rank calls every method in the same order.
"""

from __future__ import annotations

import pathlib
import time

import torch
from torch import nn

from sprite.parity import probes, store


class Recorder:
    """Collects one rank's record of one arm and writes it into the arm's namespace.

    Raises ResultError at construction if this rank's result files already exist.
    """

    def __init__(self, arm_dir: pathlib.Path, rank: int, meta: dict, model: nn.Module, probe: probes.LinearProbe):
        store.claim(arm_dir, rank)
        # Wall-clock stamps (seconds since the epoch) split start-up from compute in benchmarks; never scored.
        self.timing = {"ready": time.time()}
        self.arm_dir, self.rank, self.meta, self.probe = arm_dir, rank, meta, probe
        named = list(model.named_parameters())
        self.names = [name for name, p in named if p.requires_grad]
        self.params = [p for _, p in named if p.requires_grad]
        self.frozen = [p for _, p in named if not p.requires_grad]
        self.steps: list[dict] = []
        self.arrays: dict = {}
        initial = self._full_values(self.params, "init")
        self.initial_digest = probes.digest(initial)
        self.frozen_before = self._frozen_digests()

    def _full_values(self, tensors: list[torch.Tensor], prefix: str) -> list[torch.Tensor]:
        values = [probes.full(t.detach()).float().cpu() for t in tensors]
        if self.rank == 0:
            for name, value in zip(self.names, values):
                self.arrays[f"{prefix}/{name}"] = value.numpy().copy()
        return values

    def _frozen_digests(self) -> list[str]:
        return [probes.digest([probes.full(p.detach())]) for p in self.frozen]

    def before_clip(self, step: int, shards: list[list[int]], loss: float) -> None:
        """Records the pre-clip gradients (after any synchronisation) of ``step``."""
        grads = [p.grad for p in self.params]
        health = probes.grad_health(self.params)
        entry = {"step": step, "shards": shards, "loss": float(loss), "grad_health": health}
        if health["missing"] == 0:
            values = self._full_values(grads, f"grad/{step}")
            entry["pre_norm"] = probes.global_norm(values)
            entry["grad_digest"] = probes.digest(values)
            entry["grads_not_sharded"] = sum(not probes.is_sharded(g) for g in grads)
        self.steps.append(entry)

    def after_clip(self) -> None:
        """Records the post-clip global gradient norm of the current step."""
        grads = [probes.full(p.grad) for p in self.params if p.grad is not None]
        self.steps[-1]["post_norm"] = probes.global_norm(grads) if grads else None

    def after_update(self) -> None:
        """Records the parameters after the current step's update and the step's Linear observations."""
        entry = self.steps[-1]
        values = self._full_values(self.params, f"param/{entry['step']}")
        entry["param_digest"] = probes.digest(values)
        entry["params_not_sharded"] = sum(not probes.is_sharded(p) for p in self.params)
        entry["linear"] = self.probe.take()

    def finish(self, comm: dict) -> None:
        """Writes this rank's record (and rank 0's tensors). Raises ResultError if either exists."""
        self.timing["done"] = time.time()
        record = {
            "meta": self.meta,
            "timing": self.timing,
            "comm": comm,
            "trainable": self.names,
            "trainable_count": len(self.params),
            "frozen_count": len(self.frozen),
            "initial_digest": self.initial_digest,
            "frozen_changed": sum(a != b for a, b in zip(self.frozen_before, self._frozen_digests())),
            "steps": self.steps,
        }
        store.write_rank(self.arm_dir, self.rank, record)
        if self.rank == 0:
            store.write_tensors(self.arm_dir, self.arrays)
