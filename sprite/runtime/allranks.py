"""The launched world seen from one rank: gather a Python object from every rank, name the strategy."""

from __future__ import annotations


def gather(obj) -> list:
    """``obj`` from every rank, in rank order (``[obj]`` without an initialized process group). Every rank must
    call it. Objects travel through torch.distributed's pickling collectives on the strategy's backend."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return [obj]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def family(strategy) -> str:
    """"fsdp", "ddp", "single" or the strategy's class name."""
    from lightning.pytorch.strategies import DDPStrategy, ModelParallelStrategy, SingleDeviceStrategy

    kinds = ((ModelParallelStrategy, "fsdp"), (DDPStrategy, "ddp"), (SingleDeviceStrategy, "single"))
    return next((name for cls, name in kinds if isinstance(strategy, cls)), type(strategy).__name__)
