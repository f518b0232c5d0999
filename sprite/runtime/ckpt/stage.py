"""Copy a full-state checkpoint off the device, so that training can go on while it is written.

Lightning's checkpoint dict shares tensors (and the optimizer's per-parameter dicts) with the live model: the
next step changes them in place. :class:`HostCopy` makes a copy that nothing else references: containers rebuilt
with their own type, tensors copied to host memory (pinned where the device has it; the buffers are reused from
one save to the next when the shapes match, as torch's ``BlockingAsyncStager`` does with
``cache_staged_state_dict``), any other value deep-copied. Device copies are started together and waited for once.

:func:`shared_stager` makes the same copy for torch's process-mode ``dcp.async_save`` (an ``AsyncStager``, torch's
public protocol for it): its buffers are in shared memory, so the state reaches torch's checkpoint process as
descriptors instead of a copy through a pipe, pinned with ``torch.cuda.cudart().cudaHostRegister`` where CUDA is
present, and kept from save to save (torch 2.11's ``DefaultStager`` cannot stage twice, pytorch/pytorch#183413). A
DTensor is staged as its copy on the CPU the first time (its mesh and placements kept), whose local tensor then gets
each later save's copy.
"""

from __future__ import annotations

import copy

import torch


class HostCopy:
    """One rank's reusable host buffers for :meth:`copy` (in shared memory when ``shared``)."""

    def __init__(self, shared: bool = False):
        self.buffers: list[torch.Tensor] = []
        self.devices: set = set()
        self.shared = shared
        self.registered: list[torch.Tensor] = []  # buffers pinned with cudaHostRegister, to unregister

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
        if self.shared and _is_dtensor(tensor):
            return self._dtensor(tensor, used)
        if type(tensor) is not torch.Tensor or tensor.layout != torch.strided:
            return copy.deepcopy(tensor.cpu())  # a subclass or sparse tensor: torch copies it its own way
        index = used[0]
        used[0] += 1
        pinned = tensor.device.type != "cpu" and torch.accelerator.is_available()
        buffer = self.buffers[index] if index < len(self.buffers) else None
        if buffer is None or buffer.shape != tensor.shape or buffer.dtype != tensor.dtype:
            buffer = self._new(tensor, pinned)
            self.buffers[index:index + 1] = [buffer]
        if tensor.device.type != "cpu":
            self.devices.add(tensor.device)
        buffer.copy_(tensor, non_blocking=tensor.device.type == "cuda" if self.shared else pinned)
        return buffer

    def _new(self, tensor: torch.Tensor, pinned: bool) -> torch.Tensor:
        if not self.shared:
            return torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=pinned)
        buffer = torch.empty(tensor.shape, dtype=tensor.dtype).share_memory_()
        if tensor.device.type == "cuda" and buffer.numel() and _host_register(buffer):
            self.registered.append(buffer)
        return buffer

    def _dtensor(self, tensor, used: list):
        """A DTensor whose local tensor is a shared host buffer: copied to the CPU the first time (torch keeps the
        mesh and placements), then given each later save's copy of the local tensor."""
        index = used[0]
        used[0] += 1
        staged = self.buffers[index] if index < len(self.buffers) else None
        local = tensor.to_local()
        if (staged is None or not _is_dtensor(staged) or staged.shape != tensor.shape or staged.dtype != tensor.dtype
                or staged.placements != tensor.placements or staged.device_mesh != tensor.device_mesh
                or staged.to_local().shape != local.shape):
            staged = tensor.to("cpu", copy=True)  # a copy even from CPU, where .cpu() would be the tensor itself
            mine = staged.to_local()  # the DTensor's own local tensor (no autograd here)
            mine.share_memory_()
            if local.device.type == "cuda" and mine.numel() and _host_register(mine):
                self.registered.append(mine)
            self.buffers[index:index + 1] = [staged]
            return staged
        if local.device.type != "cpu":
            self.devices.add(local.device)
        staged.to_local().copy_(local, non_blocking=local.device.type == "cuda")
        return staged

    def release(self) -> None:
        """Unpin what was pinned and drop every buffer."""
        for buffer in self.registered:
            torch.cuda.cudart().cudaHostUnregister(buffer.data_ptr())
        self.registered, self.buffers = [], []


def _is_dtensor(tensor) -> bool:
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:
        return False
    return isinstance(tensor, DTensor)


def _host_register(buffer: torch.Tensor) -> bool:
    """Pin ``buffer``'s memory for the device's copies (torch's public CUDA runtime module); whether it is. A
    buffer left unpinned still takes the copies, synchronously."""
    return int(torch.cuda.cudart().cudaHostRegister(buffer.data_ptr(), buffer.untyped_storage().nbytes(), 0)) == 0


def shared_stager():
    """A :class:`SharedStager` (made here so that torch's staging module is imported only when one is needed)."""
    from torch.distributed.checkpoint.staging import AsyncStager

    class SharedStager(AsyncStager):
        """torch's ``AsyncStager`` protocol for process-mode ``dcp.async_save``: stages into :class:`HostCopy`'s
        shared buffers, kept from save to save; staging is done when :meth:`stage` returns."""

        _synchronize_after_execute = False

        def __init__(self):
            self.host = HostCopy(shared=True)

        def stage(self, state_dict):
            with torch.no_grad():
                return self.host.copy(state_dict)

        def synchronize_staging(self) -> None:
            """Nothing to wait for: :meth:`stage` waited for the device's copies."""

        def close(self) -> None:
            self.host.release()

    return SharedStager()
