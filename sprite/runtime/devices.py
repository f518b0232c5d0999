"""The device table: everything that differs between XPU, CUDA and CPU lives in one row.

The XPU path and the CUDA path run the same code; only the row they read differs. Tests swap ``torch.xpu`` for a
named fake to exercise the XPU row on a machine without XPUs.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass

import torch

from sprite.contract import BACKENDS
from sprite.errors import UsageError


@dataclass(frozen=True)
class DeviceType:
    """One row: the torch device type, its distributed backend and its autocast device type."""

    name: str  # torch.device type and the module name under torch ("xpu" -> torch.xpu)
    backend: str  # torch.distributed backend
    autocast: str  # device_type for torch.autocast

    def module(self):
        """The torch device module (``torch.xpu``, ``torch.cuda``); ``None`` for CPU."""
        return None if self.name == "cpu" else getattr(torch, self.name, None)

    def is_available(self) -> bool:
        """Whether this process can use at least one device of this type."""
        mod = self.module()
        if self.name == "cpu":
            return True
        return bool(mod is not None and mod.is_available())

    def device_count(self) -> int:
        """Devices of this type visible to this process (CPU counts as 1)."""
        return 1 if self.name == "cpu" else (self.module().device_count() if self.is_available() else 0)

    def rng_state(self):
        """The current device's random generator state (a uint8 tensor), ``None`` for CPU or no device."""
        return self.module().get_rng_state() if self.name != "cpu" and self.is_available() else None

    def set_rng_state(self, state) -> None:
        """Restore what :meth:`rng_state` returned on the current device (nothing for ``None`` or CPU)."""
        if state is not None and self.name != "cpu" and self.is_available():
            self.module().set_rng_state(state)

    # Measurement (sprite bench): the same calls on every row; CPU work is synchronous and has no allocator stats.
    def synchronize(self, device=None) -> None:
        """Wait until every kernel queued on ``device`` has finished (no-op on CPU)."""
        if self.name != "cpu":
            self.module().synchronize(device)

    def reset_peak_memory(self, device=None) -> None:
        """Start a new peak-memory window on ``device``: cached free blocks are released first, so reserved
        memory starts from what is in use (no-op on CPU)."""
        if self.name != "cpu":
            self.module().empty_cache()
            self.module().reset_peak_memory_stats(device)

    def peak_memory(self, device=None) -> dict | None:
        """Peak bytes allocated and reserved by torch's caching allocator since the last reset; None on CPU."""
        if self.name == "cpu":
            return None
        mod = self.module()
        return {"allocated": int(mod.max_memory_allocated(device)), "reserved": int(mod.max_memory_reserved(device))}

    def device_name(self, device=None) -> str:
        """The marketing name the driver reports (``NVIDIA H200``); for CPU the processor or machine type."""
        if self.name == "cpu":
            return f"cpu ({platform.processor() or platform.machine() or 'unknown'})"
        return str(self.module().get_device_name(device))

    def compute_units(self, device=None) -> int | None:
        """Execution units of ``device`` where the driver reports them (XPU ``gpu_eu_count``); else None."""
        if self.name == "cpu":
            return None
        props = self.module().get_device_properties(device)
        count = getattr(props, "gpu_eu_count", None) or getattr(props, "max_compute_units", None)
        return int(count) if count else None


# Backend names come from the contract, which the launcher half (sprite env) reads without importing torch.
DEVICE_TABLE: dict[str, DeviceType] = {name: DeviceType(name, BACKENDS[name], name) for name in ("xpu", "cuda", "cpu")}
ALIASES = {"gpu": "cuda"}
PREFERENCE = ("xpu", "cuda", "cpu")  # what "auto" picks, first available wins


def device_type(name: str) -> DeviceType:
    """The table row for ``name`` ("xpu", "cuda", "gpu", "cpu", or "auto" = first available of xpu, cuda, cpu).

    Raises:
        UsageError: the name is not in the table.
    """
    name = ALIASES.get(name, name)
    if name == "auto":
        return next(DEVICE_TABLE[n] for n in PREFERENCE if DEVICE_TABLE[n].is_available())
    if name not in DEVICE_TABLE:
        raise UsageError(
            f"Unknown accelerator {name!r}.",
            "sprite knows only the device types in its device table.",
            f"Use one of: auto, {', '.join(DEVICE_TABLE)}.",
        )
    return DEVICE_TABLE[name]


def backend_for(device: torch.device) -> str:
    """The distributed backend for a device (``xpu`` -> xccl, ``cuda`` -> nccl, ``cpu`` -> gloo)."""
    return device_type(device.type).backend
