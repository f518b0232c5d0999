"""Make a plain ``Fabric(...)`` run the launched world, as trainer_wrap.py does for ``Trainer(...)``.

The checks and fills are launched_args.py's (shared with the Trainer); what is Fabric's own is the strategy and
precision classes: Lightning's Fabric ``DDPStrategy`` and ``ModelParallelStrategy`` (FSDP2 over every rank,
sharded with :func:`sprite.runtime.shard.shard_model` semantics), and Fabric's ``MixedPrecision`` given as a plugin
with the device's autocast type. The launcher's cluster environment creates no processes, so ``fabric.launch()``
starts none (Lightning 2.6.6 fabric/strategies/ddp.py _configure_launcher; subprocess_script.py launch).
"""

from __future__ import annotations

import functools
import inspect

from lightning.fabric import Fabric
from lightning.fabric.plugins.precision import MixedPrecision, Precision
from lightning.fabric.strategies import DDPStrategy, ModelParallelStrategy, Strategy
from torch import nn

from sprite.runtime import launched_args, world_check
from sprite.runtime.checks import findings
from sprite.runtime.config import RuntimeConfig
from sprite.runtime.devices import DeviceType
from sprite.runtime.precision import MIXED, normalize_precision

_SPAWNING = ("ddp_spawn", "ddp_fork", "ddp_notebook")


def shard_for_fabric(module: nn.Module, mesh) -> nn.Module:
    """FSDP2 over the data-parallel mesh: Hugging Face blocks (``_no_split_modules``) bottom-up, else every child
    that holds parameters, then the root."""
    from torch.distributed.fsdp import FSDPModule, fully_shard

    from sprite.runtime.shard import block_classes, shard_model

    dp = mesh["data_parallel"]
    if block_classes(module):
        return shard_model(module, dp)
    for child in module.children():
        if not isinstance(child, FSDPModule) and any(True for _ in child.parameters()):
            fully_shard(child, mesh=dp)
    return module if isinstance(module, FSDPModule) else fully_shard(module, mesh=dp)


class FabricDDPStrategy(DDPStrategy):
    """Fabric's DDP without the CUDA stream off CUDA, as XPUDDPStrategy is for the Trainer."""

    def setup_module(self, module: nn.Module):
        if self.root_device.type == "cuda":
            return super().setup_module(module)
        # Lightning 2.6.6 fabric/strategies/ddp.py:128 wraps DDP in torch.cuda.stream whenever device_ids is set,
        # which raises without CUDA (an XPU run).
        from torch.nn.parallel import DistributedDataParallel

        return DistributedDataParallel(module=module, device_ids=self._determine_ddp_device_ids(), **self._ddp_kwargs)


def _make(wanted: str, cfg: RuntimeConfig, kind: DeviceType) -> Strategy:
    if wanted == "fsdp":
        return ModelParallelStrategy(shard_for_fabric, data_parallel_size=cfg.world_size, tensor_parallel_size=1,
                                     process_group_backend=kind.backend)
    return FabricDDPStrategy(process_group_backend=kind.backend)


def _strategy(cfg: RuntimeConfig, kind: DeviceType, given):
    if cfg.world_size > 1 and isinstance(given, str) and given in _SPAWNING:
        finding = findings.spawning_strategy(f"Fabric(strategy={given!r})", "spawn", cfg.world_size)
        findings.report(finding, "strict", rank_zero=True)
    wanted = launched_args.strategy_family("Fabric", cfg, given)
    if not wanted:
        if given == "ddp":  # Fabric's own "ddp" takes nccl for cuda, else gloo: the device table's backend instead
            return _make("ddp", cfg, kind)
        return "auto" if given is None else given
    if isinstance(given, Strategy):
        return given
    if wanted not in ("ddp", "fsdp"):
        return given
    return _make(wanted, cfg, kind)


def _precision(cfg: RuntimeConfig, kind: DeviceType, kwargs: dict, plugins: list) -> None:
    """Mixed precision as a plugin autocasting for ``kind`` (Fabric's connector.py:492 would pick "cuda" for an
    accelerator instance or any name but cpu/mps, as the Trainer's does); other precisions stay arguments."""
    if any(isinstance(p, Precision) for p in plugins):
        return
    target = launched_args.precision_target("Fabric", cfg, kwargs.get("precision"))
    if target is None:
        return
    if normalize_precision(target) in MIXED:
        kwargs.pop("precision", None)
        plugins.append(MixedPrecision(normalize_precision(target), kind.autocast))
    else:
        kwargs["precision"] = normalize_precision(target)


def launched_fabric_kwargs(cfg: RuntimeConfig, kwargs: dict) -> dict:
    """The script's Fabric kwargs with the launched world filled in.

    Raises:
        UsageError: an explicit argument (accelerator, devices, num_nodes, strategy, precision) contradicts the
            launch, or the strategy would spawn processes of its own in a launched world.
    """
    kwargs = dict(kwargs)
    kwargs["num_nodes"] = launched_args.num_nodes("Fabric", cfg, kwargs.get("num_nodes"))
    kwargs["accelerator"], kind = launched_args.accelerator("Fabric", cfg.accelerator, kwargs.get("accelerator"))
    kwargs["devices"] = launched_args.devices("Fabric", cfg, kwargs.get("devices"))
    kwargs["strategy"] = _strategy(cfg, kind, kwargs.get("strategy"))
    plugins = launched_args.as_list(kwargs.get("plugins"))
    _precision(cfg, kind, kwargs, plugins)
    launched_args.add_environment(cfg, plugins)
    kwargs["plugins"] = plugins
    return kwargs


def install(cfg: RuntimeConfig) -> None:
    """Wrap ``lightning.fabric.Fabric.__init__`` (the same class as ``lightning.Fabric``) for this launch."""
    original = Fabric.__init__
    if getattr(original, "_sprite_launch", None) is not None:
        original = original.__wrapped__
    signature = inspect.signature(original)

    @functools.wraps(original)
    def __init__(self, *given, **kwargs):
        bound = signature.bind_partial(self, *given, **kwargs).arguments
        bound.pop("self", None)
        world_check.seen("Fabric")
        original(self, **launched_fabric_kwargs(cfg, bound))

    __init__._sprite_launch = cfg
    Fabric.__init__ = __init__
