"""Copy a full-state checkpoint off the device, so that training can go on while it is written.

Lightning's checkpoint dict shares tensors (and the optimizer's per-parameter dicts) with the live model: the
next step changes them in place. :class:`HostCopy` makes a copy that nothing else references: containers rebuilt
with their own type, tensors copied to host memory (pinned where the device has it; the buffers are reused from
one save to the next when the shapes match, as torch's ``BlockingAsyncStager`` does with
``cache_staged_state_dict``), any other value deep-copied. Device copies are started together and waited for once.
"""

from __future__ import annotations

import copy

import torch


class HostCopy:
    """One rank's reusable host buffers for :meth:`copy`."""

    def __init__(self):
        self.buffers: list[torch.Tensor] = []
        self.devices: set = set()

    def copy(self, state):
        """A copy of ``state`` whose tensors live in host memory of this process alone."""
        self.devices, used = set(), [0]
        out = self._copy(state, used)
        for device in self.devices:
            torch.get_device_module(device).synchronize(device)
        return out

    def _copy(self, value, used: list):
        if isinstance(value, torch.Tensor):
            return self._tensor(value, used)
        if isinstance(value, dict):
            try:
                out = type(value)()
            except TypeError:  # a mapping type that needs arguments: a plain dict holds the same items
                out = {}
            for key, item in value.items():
                out[key] = self._copy(item, used)
            if hasattr(value, "__dict__") and hasattr(out, "__dict__"):  # an OrderedDict's _metadata, an AttributeDict's fields
                out.__dict__.update(copy.deepcopy(value.__dict__))
            return out
        if isinstance(value, list) and type(value) is list:
            return [self._copy(item, used) for item in value]
        if type(value) is tuple:
            return tuple(self._copy(item, used) for item in value)
        return copy.deepcopy(value)

    def _tensor(self, tensor: torch.Tensor, used: list) -> torch.Tensor:
        tensor = tensor.detach()
        if type(tensor) is not torch.Tensor or tensor.layout != torch.strided:
            return copy.deepcopy(tensor.cpu())  # a subclass or sparse tensor: torch copies it its own way
        index = used[0]
        used[0] += 1
        pinned = tensor.device.type != "cpu" and torch.accelerator.is_available()
        buffer = self.buffers[index] if index < len(self.buffers) else None
        if buffer is None or buffer.shape != tensor.shape or buffer.dtype != tensor.dtype:
            buffer = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=pinned)
            self.buffers[index:index + 1] = [buffer]
        if tensor.device.type != "cpu":
            self.devices.add(tensor.device)
        buffer.copy_(tensor, non_blocking=pinned)
        return buffer
