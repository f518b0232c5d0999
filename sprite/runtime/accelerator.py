"""``XPUAccelerator``: Lightning's missing accelerator for Intel XPUs (Lightning #20938).

Each rank uses ``xpu:<local rank>`` out of every tile the node exposes, exactly as CUDA ranks use
``cuda:<local rank>``. Registered with Lightning as ``accelerator="xpu"``.
"""

from __future__ import annotations

from typing import Any, Union

import torch
from lightning.pytorch.accelerators import Accelerator

from sprite.errors import SpriteError
from sprite.runtime.devices import DEVICE_TABLE

_XPU = DEVICE_TABLE["xpu"]


class XPUAccelerator(Accelerator):
    """Accelerator for Intel Data Center GPU Max tiles (``torch.xpu``)."""

    def setup_device(self, device: torch.device) -> None:
        """Make ``device`` this process's current XPU.

        Raises:
            SpriteError: the device is not an XPU, or this process cannot see it.
        """
        if device.type != "xpu":
            raise SpriteError(f"XPUAccelerator was given device {device}.", "It drives Intel XPUs only.",
                              "Pass an xpu device, or use Lightning's accelerator for that device type.")
        visible = _XPU.device_count()
        index = device.index or 0
        if index >= visible:
            raise SpriteError(
                f"This process sees {visible} XPU device(s) but was assigned xpu:{index}.",
                "Ranks select their tile by local rank; a per-rank ZE_AFFINITY_MASK hides the other tiles.",
                "Launch without a per-rank ZE_AFFINITY_MASK (set ZE_FLAT_DEVICE_HIERARCHY=FLAT for one device"
                " per tile).",
            )
        _XPU.module().set_device(index)

    def get_device_stats(self, device: Any) -> dict[str, Any]:
        """Memory statistics of ``device`` as torch reports them."""
        return dict(_XPU.module().memory_stats(device))

    def teardown(self) -> None:
        _XPU.module().empty_cache()

    @staticmethod
    def parse_devices(devices: Union[int, str, list[int]]) -> list[int]:
        """Device indices from a Lightning ``devices`` value (``2`` -> [0, 1], ``[3]`` -> [3], ``-1`` -> all)."""
        if devices == -1 or devices == "-1" or devices == "auto":
            return list(range(_XPU.device_count()))
        if isinstance(devices, int) or (isinstance(devices, str) and "," not in devices):
            return list(range(int(devices)))
        items = devices.split(",") if isinstance(devices, str) else devices
        return [int(i) for i in items if str(i).strip()]

    @staticmethod
    def get_parallel_devices(devices: Union[int, str, list[int]]) -> list[torch.device]:
        """One ``torch.device("xpu", i)`` per parsed index."""
        return [torch.device("xpu", i) for i in XPUAccelerator.parse_devices(devices)]

    @staticmethod
    def auto_device_count() -> int:
        return _XPU.device_count()

    @staticmethod
    def is_available() -> bool:
        return _XPU.is_available()

    @staticmethod
    def name() -> str:
        return "xpu"

    @classmethod
    def register_accelerators(cls, accelerator_registry: Any) -> None:
        accelerator_registry.register("xpu", cls, description=cls.__name__, override=True)
