"""What a rank's training state is, as digests: captured inside every save and again after every restore.

A capture holds, per tensor name, the sha256 of dtype, shape and bytes of: the trainable tensors, AdamW's state
(step, exp_avg, exp_avg_sq) and the devices it lives on, every frozen tensor; plus the param groups (without
their parameters), the LR scheduler's state and the loop position. ``local`` digests cover what this rank holds
(its shard under FSDP2), ``full`` digests the gathered value; full values are gathered only when asked, since
for FSDP2 that is a collective every rank must join in the same order. Only rank workers import this module.
"""

from __future__ import annotations

import hashlib
import json
import math

import torch
from torch import nn

OPTIMIZER_KEYS = ("step", "exp_avg", "exp_avg_sq")


def local(tensor: torch.Tensor) -> torch.Tensor:
    """What this rank holds of ``tensor`` (its shard of a DTensor)."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


def full(tensor: torch.Tensor) -> torch.Tensor:
    """The gathered value of ``tensor`` (a collective for a DTensor)."""
    return tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor


def digest(tensor: torch.Tensor) -> str:
    """sha256 over dtype, shape and bytes: equal digests mean bitwise-equal tensors."""
    value = tensor.detach().cpu().contiguous()
    sha = hashlib.sha256(f"{value.dtype}{tuple(value.shape)}".encode())
    sha.update(value.reshape(-1).view(torch.uint8).numpy().tobytes())
    return sha.hexdigest()


def plain(value):
    """``value`` as JSON holds it exactly: tensors as lists, tuples as lists, non-finite floats as strings."""
    if isinstance(value, torch.Tensor):
        return plain(value.tolist())
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, dict):
        return {str(key): plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)


def _optimizer_entries(net: nn.Module, optimizer) -> list[tuple[str, str, torch.Tensor]]:
    """(parameter name, state key, tensor) for every AdamW state tensor, in parameter order."""
    names = {id(p): name for name, p in net.named_parameters()}
    entries = []
    for group in optimizer.param_groups:
        for param in group["params"]:
            state = optimizer.state.get(param, {})
            entries += [(names.get(id(param), "?"), key, state[key]) for key in OPTIMIZER_KEYS if key in state]
    return entries


def capture(net: nn.Module, optimizer, scheduler, loop: dict, gather: bool) -> dict:
    """The digests of this rank's state (see the module docstring); ``gather`` adds the full-value digests."""
    named = list(net.named_parameters())
    trainable = [(n, p) for n, p in named if p.requires_grad]
    frozen = [(n, p) for n, p in named if not p.requires_grad]
    entries = _optimizer_entries(net, optimizer)
    groups = [{k: v for k, v in group.items() if k != "params"} for group in optimizer.param_groups]
    state = {
        "trainables": {n: digest(local(p)) for n, p in trainable},
        "frozen": {n: digest(local(p)) for n, p in frozen},
        "optimizer": {f"{n}/{k}": digest(local(t)) for n, k, t in entries},
        "optimizer_devices": sorted({str(local(t).device) for _, _, t in entries}),
        "param_groups": plain(groups),
        "scheduler": plain(scheduler.state_dict()),
        "loop": dict(loop),
    }
    if gather:
        state["trainables_full"] = {n: digest(full(p)) for n, p in trainable}
        state["frozen_full"] = {n: digest(full(p)) for n, p in frozen}
        state["optimizer_full"] = {f"{n}/{k}": digest(full(t)) for n, k, t in entries}
    return json.loads(json.dumps(state))


def arrays(net: nn.Module, optimizer, prefix: str) -> dict:
    """Full fp32 values of the trainables and their AdamW moments, keyed ``prefix/kind/name`` (a collective
    under FSDP2: every rank calls it; only rank 0 keeps the result)."""
    out = {f"{prefix}/param/{n}": full(p.detach()).float().cpu().numpy().copy()
           for n, p in net.named_parameters() if p.requires_grad}
    for name, key, tensor in _optimizer_entries(net, optimizer):
        if key != "step":
            out[f"{prefix}/{key}/{name}"] = full(tensor.detach()).float().cpu().numpy().copy()
    return out
