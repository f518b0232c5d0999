"""How the ddp and fsdp arms get their Trainer arguments, shard their model and describe communication.

The launched world (SPRITE_* variables, or the arm's settings when run without sprite's launcher) decides
devices and nodes. FSDP2 is data parallel over every process: fully_shard on each decoder layer, then root.
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
    otherwise Lightning's own DDP / ModelParallel strategy and precision plugin (direct runs, debugging)."""
    if under_sprite_runtime():
        return {}
    from lightning.pytorch.plugins import MixedPrecision
    from lightning.pytorch.strategies import DDPStrategy, ModelParallelStrategy

    from sprite.parity.recipe import pick_device

    device = pick_device(settings.accelerator).type
    if arm == "ddp":
        strategy = DDPStrategy()
    else:
        strategy = ModelParallelStrategy(data_parallel_size=settings.world, tensor_parallel_size=1)
    kwargs = dict(accelerator=device, devices=settings.devices, num_nodes=settings.nodes, strategy=strategy)
    if settings.precision == "bf16-mixed":
        # An accelerator given as anything but "cpu"/"mps" autocasts for "cuda" (Lightning 2.6.6
        # accelerator_connector.py:489); an explicit plugin names the device.
        kwargs["plugins"] = [MixedPrecision("bf16-mixed", device=device)]
    else:
        kwargs["precision"] = "32-true"
    return kwargs


def shard(net: nn.Module, mesh) -> None:
    """Applies FSDP2 with sprite.shard_model (each decoder layer, then the root; default fp32 policy)."""
    from sprite.runtime.shard import shard_model

    shard_model(net, mesh)


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
