"""Torch-side injection of the negative controls into the ddp/fsdp arm (never active without --fault).

What each fault does is described in faults.py; this module only applies it at the matching point of a
Lightning step. Every method is a no-op for the faults it does not concern.
"""

from __future__ import annotations

import torch


class Injector:
    """Applies one fault (or none) to the training step of one rank."""

    def __init__(self, fault: str | None, rank: int, world: int, steps: int):
        self.fault, self.rank, self.world, self.last_step = fault, rank, world, steps - 1
        self.local_grad: torch.Tensor | None = None
        self.target: torch.Tensor | None = None
        self.snapshot: list[torch.Tensor] = []

    def watch_adapter(self, named_params: list[tuple[str, torch.Tensor]]) -> None:
        """local-adapter: keeps the local (pre-synchronisation) gradient of the first LoRA tensor."""
        if self.fault != "local-adapter":
            return
        self.target = next(p for name, p in named_params if "lora_A" in name)
        self.target.register_hook(self._stash)

    def _stash(self, grad: torch.Tensor) -> None:
        self.local_grad = grad.detach().clone()

    def patch_backbone(self, net, device_type: str) -> None:
        """fp32-backbone: makes the model run its backbone with autocast disabled (the head keeps it)."""
        if self.fault == "fp32-backbone":
            net.backbone_context = lambda: torch.autocast(device_type, enabled=False)

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """missing-rank zeroes the last rank's loss; wrong-scale multiplies every rank's loss by N."""
        if self.fault == "missing-rank" and self.rank == self.world - 1:
            return loss * 0.0
        if self.fault == "wrong-scale":
            return loss * self.world
        return loss

    @torch.no_grad()
    def after_sync(self, params: list[torch.Tensor]) -> None:
        """scale-grad multiplies synchronised gradients by N; local-adapter restores its local gradient."""
        if self.fault == "scale-grad":
            for param in params:
                param.grad.mul_(self.world)
        if self.fault == "local-adapter" and self.local_grad is not None:
            self.target.grad.copy_(self.local_grad)

    @torch.no_grad()
    def before_update(self, params: list[torch.Tensor], step: int) -> None:
        """skip-update: ranks other than 0 remember their parameters before the last update."""
        if self.fault == "skip-update" and self.rank != 0 and step == self.last_step:
            self.snapshot = [param.detach().clone() for param in params]

    @torch.no_grad()
    def after_update(self, params: list[torch.Tensor]) -> None:
        """skip-update: ranks other than 0 put the remembered parameters back (the update never happened)."""
        for param, value in zip(params, self.snapshot):
            param.copy_(value)
        self.snapshot = []
