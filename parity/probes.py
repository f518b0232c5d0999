"""Torch-side measurements the arms record: Linear sites, gradient health, norms, digests, full values.

Only arm workers import this module (it imports torch).
"""

from __future__ import annotations

import hashlib

import torch
from torch import nn


def full(tensor: torch.Tensor) -> torch.Tensor:
    """The full value of a tensor; a DTensor is gathered (a collective: every rank must call it)."""
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def is_sharded(tensor: torch.Tensor) -> bool:
    """True for a DTensor with at least one Shard placement."""
    placements = getattr(tensor, "placements", None)
    return bool(placements) and any(p.is_shard() for p in placements)


def digest(tensors: list[torch.Tensor]) -> str:
    """sha256 over the bytes of ``tensors`` in order (bitwise equality test across ranks and arms)."""
    sha = hashlib.sha256()
    for tensor in tensors:
        sha.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return sha.hexdigest()


def global_norm(tensors: list[torch.Tensor]) -> float:
    """The L2 norm over all ``tensors``, computed as clip_grad_norm_ does (norm of per-tensor norms)."""
    norms = [torch.linalg.vector_norm(t.detach().float()) for t in tensors]
    return float(torch.linalg.vector_norm(torch.stack(norms)))


def grad_health(params: list[torch.Tensor]) -> dict:
    """Counts trainable tensors whose gradient is missing, not fp32, or not finite."""
    missing = sum(p.grad is None for p in params)
    present = [p.grad for p in params if p.grad is not None]
    not_fp32 = sum(g.dtype != torch.float32 for g in present)
    not_finite = sum(not bool(torch.isfinite(full(g)).all()) for g in present)
    return {"missing": missing, "not_fp32": not_fp32, "not_finite": not_finite}


class LinearProbe:
    """Watches every nn.Linear forward: output dtype, parameter dtype and autocast state.

    A call is valid when its output has ``out_dtype``, its weight is fp32 and autocast on the input's device is
    ``autocast`` (True for bf16-mixed, False for fp32 arms).
    """

    def __init__(self, model: nn.Module, out_dtype: torch.dtype, autocast: bool):
        self.out_dtype, self.autocast = out_dtype, autocast
        self.sites = 0
        self.invalid: list[str] = []
        self.handles = [
            module.register_forward_hook(self._hook(name))
            for name, module in model.named_modules()
            if isinstance(module, nn.Linear)
        ]

    def _hook(self, name: str):
        def hook(module, args, output):
            device = args[0].device.type if args else "cpu"
            state = torch.is_autocast_enabled(device)
            ok = output.dtype == self.out_dtype and module.weight.dtype == torch.float32 and state == self.autocast
            self.sites += 1
            if not ok:
                self.invalid.append(f"{name}: out {output.dtype}, weight {module.weight.dtype}, autocast {state}")

        return hook

    def take(self) -> dict:
        """Returns this step's observations and starts a new step."""
        seen = {"sites": self.sites, "invalid": len(self.invalid), "examples": self.invalid[:3]}
        self.sites, self.invalid = 0, []
        return seen
