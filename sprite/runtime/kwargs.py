"""``trainer_kwargs``: the Trainer arguments for a strategy on sprite's devices, for scripts that write them out.

    trainer = L.Trainer(**trainer_kwargs("ddp", devices=12, num_nodes=2), max_epochs=10)
"""

from __future__ import annotations

import os
from typing import Optional, Union

import torch
from lightning.pytorch.strategies import SingleDeviceStrategy, Strategy

from sprite.errors import UsageError
from sprite.runtime.ddp import XPUDDPStrategy
from sprite.runtime.devices import DeviceType, device_type
from sprite.runtime.environment import ENVIRONMENTS
from sprite.runtime.fsdp2 import FSDP2Strategy
from sprite.runtime.precision import precision_plugin
from sprite.runtime.ranks import detect_flavour

STRATEGIES = ("single", "ddp", "fsdp")


def accelerator_for(kind: DeviceType):
    """The value for ``Trainer(accelerator=...)``: an XPUAccelerator instance for xpu, else Lightning's name."""
    if kind.name == "xpu":
        from sprite.runtime.accelerator import XPUAccelerator

        return XPUAccelerator()
    return kind.name


def single_device(kind: DeviceType, devices: Union[int, str, list]) -> torch.device:
    """The one device a "single" run pins: ``[3]`` -> index 3; "auto" or 1 -> the current device.

    Raises:
        UsageError: more than one device requested.
    """
    if isinstance(devices, (list, tuple)) and len(devices) == 1:
        return torch.device(kind.name, int(devices[0])) if kind.name != "cpu" else torch.device("cpu")
    if devices not in ("auto", 1, "1"):
        raise UsageError(
            f"strategy 'single' was given devices={devices!r}.",
            "A single-device run uses exactly one device.",
            "Pass devices=1, 'auto' or a one-element list such as [3].",
        )
    if kind.name == "cpu":
        return torch.device("cpu")
    return torch.device(kind.name, kind.module().current_device())


def make_strategy(strategy: str, kind: DeviceType, devices) -> Strategy:
    """A strategy instance for "single", "ddp" or "fsdp".

    Raises:
        UsageError: an unknown strategy name.
    """
    if strategy == "single":
        return SingleDeviceStrategy(device=single_device(kind, devices))
    if strategy == "ddp":
        return XPUDDPStrategy()
    if strategy == "fsdp":
        return FSDP2Strategy()
    raise UsageError(f"Unknown strategy {strategy!r}.", "sprite builds only its own single, DDP and FSDP2 strategies.",
                     f"Use one of: {', '.join(STRATEGIES)}.")


def trainer_kwargs(
    strategy: str = "ddp",
    devices: Union[int, str, list] = "auto",
    num_nodes: int = 1,
    precision: Optional[Union[str, int]] = "bf16-mixed",
    accelerator: str = "auto",
) -> dict:
    """Trainer arguments: accelerator, strategy, devices, num_nodes and plugins (precision, cluster environment).

    ``precision`` "bf16-mixed"/"16-mixed" (and "bf16", "16", 16) autocast for the chosen device; "32-true" and
    "bf16-true" are Lightning's own; None leaves precision to the Trainer. A cluster environment is added when an
    external launcher (PALS, Hydra, Open MPI, torchrun or sprite's supervisor) started this process.

    Raises:
        UsageError: unknown strategy, accelerator or precision, or several devices for "single".
    """
    kind = device_type(accelerator)
    plugins = [] if precision is None else [precision_plugin(precision, kind.name)]
    flavour = detect_flavour(os.environ)
    if flavour in ENVIRONMENTS and strategy != "single":
        plugins.append(ENVIRONMENTS[flavour]())
    return {
        "accelerator": accelerator_for(kind),
        "strategy": make_strategy(strategy, kind, devices),
        "devices": 1 if strategy == "single" else devices,
        "num_nodes": num_nodes,
        "plugins": plugins,
    }
