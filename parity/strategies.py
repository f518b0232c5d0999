"""How the ddp and fsdp arms get their Trainer arguments and describe communication.

The launched world (SPRITE_* variables, or the arm's settings when run without sprite's launcher) decides
devices and nodes.
"""

from __future__ import annotations

import torch
from torch import nn

from sprite.parity.settings import Settings


def under_sprite_runtime() -> bool:
    """True when ``python -m sprite.runtime`` installed the launched world into Trainer."""
    from lightning.pytorch import Trainer

    return getattr(Trainer.__init__, "_sprite_launch", None) is not None


def trainer_kwargs(arm: str, settings: Settings) -> dict:
    """Trainer arguments for the ddp or fsdp arm: none under sprite's runtime (it fills in the launched world);
    otherwise the same strategy, device and precision plugin from ``sprite.trainer_kwargs`` (direct runs,
    debugging)."""
    if under_sprite_runtime():
        return {}
    from sprite.runtime.kwargs import trainer_kwargs as sprite_trainer_kwargs

    return sprite_trainer_kwargs(arm, devices=settings.devices, num_nodes=settings.nodes,
                                 precision=settings.precision, accelerator=settings.accelerator)


def communication(strategy, net: nn.Module) -> dict:
    """Describes what goes over the wire: DDP reducer hooks and dtypes, or FSDP2's mixed-precision policy."""
    from torch.distributed.fsdp import FSDPModule

    dtypes = sorted({str(p.dtype) for p in net.parameters() if p.requires_grad})
    if isinstance(net, FSDPModule):
        policy = net._get_fsdp_state()._mp_policy
        return {
            "kind": "fsdp2", "param_dtypes": dtypes,
            "param_dtype": str(policy.param_dtype), "reduce_dtype": str(policy.reduce_dtype),
        }
    wrapped = getattr(strategy, "model", None)
    if isinstance(wrapped, torch.nn.parallel.DistributedDataParallel):
        return {
            "kind": "ddp", "param_dtypes": dtypes,
            "comm_hooks": len(getattr(wrapped, "_comm_hooks", [])),
            "mixed_precision": str(wrapped.mixed_precision),
        }
    return {"kind": "unknown", "param_dtypes": dtypes, "strategy": type(strategy).__name__,
            "wrapper": type(wrapped).__name__}
