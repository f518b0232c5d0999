"""Make sprite's names usable as Lightning strings: ``accelerator="xpu"``, ``strategy="xpu_ddp"``/``"fsdp2"``."""

from __future__ import annotations


def register() -> None:
    """Register XPUAccelerator, XPUDDPStrategy and FSDP2Strategy with Lightning's registries (idempotent)."""
    from lightning.pytorch.accelerators import AcceleratorRegistry
    from lightning.pytorch.strategies import StrategyRegistry

    from sprite.runtime.accelerator import XPUAccelerator
    from sprite.runtime.ddp import XPUDDPStrategy
    from sprite.runtime.fsdp2 import FSDP2Strategy

    XPUAccelerator.register_accelerators(AcceleratorRegistry)
    XPUDDPStrategy.register_strategies(StrategyRegistry)
    FSDP2Strategy.register_strategies(StrategyRegistry)
