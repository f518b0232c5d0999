"""Copy a checkpoint's state off the device, so that training can go on while it is written.

Lightning's checkpoint dict shares tensors (and the optimizer's per-parameter dicts) with the live model: the
next step changes them in place. :class:`HostCopy` makes a copy that nothing else references: containers rebuilt
with their own type, tensors copied to host memory (pinned where the device has it; the buffers are reused from
one save to the next when the shapes match, as torch's ``BlockingAsyncStager`` does with
``cache_staged_state_dict``), any other value deep-copied.

Queued copies (:meth:`HostCopy.queue`, what background saves use while ``QUEUED`` is True): the copies from a
CUDA device run on a stream of their own (:func:`_side_stream`), after what the training loop queued before the
save, and the training loop does not wait for them. :func:`fence`, which ``sprite.runtime.ckpt.save.collecting``
calls as a save's staging ends, makes every later kernel on the loop's stream wait for them on the device, so no
kernel changes a value before it is copied; the allocator is told of the side stream's use of every source
(``Tensor.record_stream``), so a source freed meanwhile is not reused before its copy. The writer waits for the
copies on the host (:meth:`Ticket.wait`) before it reads them. The device's compute waits for the copies as
before; what goes on meanwhile is the host's work (the next step's Python and kernel launches, data loading),
which a synchronous copy held up. A save's own barrier (Lightning's ``strategy.barrier`` after
``save_checkpoint``) synchronises only the loop's stream, so it does not wait for the side stream. Copies are
queued from CUDA devices only, where they were tested (an H200, docs/runs/h200-2026-12-03-b); from any other
accelerator (XPU) the save waits for them, as before.

:func:`stager` makes the same copy for torch's ``dcp.async_save`` (an ``AsyncStager``, torch's public protocol
for it), returning a ``Future`` that is done when the copies are; in process mode (``shared``) its buffers are in
shared memory, so the state reaches torch's checkpoint process as descriptors instead of a copy through a pipe,
pinned with ``torch.cuda.cudart().cudaHostRegister`` where CUDA is present, and kept from save to save (torch
2.11's ``DefaultStager`` cannot stage twice, pytorch/pytorch#183413). A DTensor is staged as its copy on the CPU
the first time (its mesh and placements kept), whose local tensor then gets each later save's copy.

Shared buffers are views of one block of shared memory, laid out for the whole state at once
(:meth:`HostCopy._lay_out`; again only when a tensor's shape, dtype or placement changed). torch's pipe to its
checkpoint process pickles each shared storage as a descriptor that the process fetches from this rank's
``multiprocessing.resource_sharer`` thread, one authenticated connection each, served by Python under this rank's
GIL. With a block for each of a 0.5B model's 872 tensors, a Python-bound loop beside the hand-over lost 304 ms a
save on two cores, against 15 ms with one block (benchmarks/shared_send.py, docs/runs/cpu-2026-12-04); on one H200
one block sealed a save 2.26 s after its call against 2.92 s (docs/runs/h200-2026-12-04-c). ``ONE_BLOCK`` False:
a block each, the benchmark's ``--buffer-per-tensor``. torch's writer copies each view out of the block before it
saves it (a tensor is saved with its whole storage), in its own process.
"""

from __future__ import annotations

import copy
import os
import threading

import torch

QUEUED = True  # background saves queue their device copies (module docstring); False: they wait for them
ONE_BLOCK = True  # shared buffers are views of one block of shared memory (module docstring); False: a block each
ALIGN = 4096  # bytes: where each view of a block starts (a page: the device's copies into it stay aligned)

_streams: dict = {}  # device -> the side stream its queued copies run on
_unfenced: list = []  # (device, event) of queued copies no fence has ordered the loop's stream after yet
_lock = threading.Lock()


class Ticket:
    """The copies one :meth:`HostCopy.queue` queued: :meth:`wait` returns once they are in host memory."""

    def __init__(self, events: list):
        self.events = events

    def wait(self) -> None:
        for event in self.events:
            event.synchronize()  # releases the GIL while it waits


def fence() -> None:
    """Make every kernel the training loop queues from now on wait, on the device, for the copies queued so far."""
    with _lock:
        pending, _unfenced[:] = list(_unfenced), []
    for device, event in pending:
        torch.get_device_module(device).current_stream(device).wait_event(event)


def _side_stream(device):
    stream = _streams.get(device)
    if stream is None:
        stream = _streams[device] = torch.get_device_module(device).Stream(device)
    return stream


def _forget_streams() -> None:
    """In a forked child: the parent's streams and events are not this process's."""
    _streams.clear()
    _unfenced.clear()


os.register_at_fork(after_in_child=_forget_streams)


def _synchronize(devices) -> None:
    for device in devices:
        torch.get_device_module(device).synchronize(device)


def _accelerated(device) -> bool:
    return device.type != "cpu" and device.type != "meta" and hasattr(torch.get_device_module(device), "Stream")


class HostCopy:
    """One rank's reusable host buffers for :meth:`copy` and :meth:`queue` (in shared memory when ``shared``)."""

    def __init__(self, shared: bool = False):
        self.buffers: list = []
        self.devices: set = set()
        self.shared = shared
        self.registered: list[torch.Tensor] = []  # buffers pinned with cudaHostRegister, to unregister
        self._streams: dict | None = None  # device -> side stream while queue() copies; None: copy() waits

    def copy(self, state):
        """A copy of ``state`` whose tensors live in host memory of this process alone, complete on return."""
        self.devices, used = set(), [0]
        with torch.no_grad():
            self._lay_out(state)
            out = self._copy(state, used)
        _synchronize(self.devices)
        return out

    def queue(self, state) -> tuple:
        """``(copy, ticket)``: the copy :meth:`copy` makes, with its device copies queued (module docstring) and
        ``ticket.wait()`` to wait for them. With ``QUEUED`` False, the copy is complete on return."""
        if not QUEUED:
            return self.copy(state), Ticket([])
        self.devices, used, self._streams = set(), [0], {}
        try:
            with torch.no_grad():  # nothing here is differentiated; see _tensor
                self._lay_out(state)
                out = self._copy(state, used)
        finally:
            streams, self._streams = self._streams, None
        events = []
        for device, stream in streams.items():
            event = torch.get_device_module(device).Event()
            event.record(stream)
            events.append(event)
            with _lock:
                _unfenced.append((device, event))
        _synchronize(self.devices)  # copies from an accelerator other than CUDA, made on the loop's stream
        return out, Ticket(events)

    def _lay_out(self, state) -> None:
        """In shared mode (with ``ONE_BLOCK``), unless the buffers fit ``state``'s tensors already: make every buffer
        anew, as a view of one new block of shared memory (module docstring), and let the old block go."""
        if not (self.shared and ONE_BLOCK):
            return
        tensors = [tensor for tensor in _leaves(state) if _buffered(tensor)]
        if len(tensors) == len(self.buffers) and all(map(_fits, self.buffers, tensors)):
            return
        starts, end = [], 0
        for tensor in tensors:
            starts.append(-(-end // ALIGN) * ALIGN)
            end = starts[-1] + _local(tensor).nbytes
        _room(end, again=bool(self.buffers))
        # this rank's hold on the old block goes first (torch's process keeps the save before's until the next comes)
        self.release()
        block = torch.empty(end, dtype=torch.uint8).share_memory_()
        buffers = []
        for tensor, start in zip(tensors, starts):
            # a DTensor: its copy on the CPU keeps the mesh and placements (the data is copied again at every save)
            buffer = tensor.to("cpu", copy=True) if _is_dtensor(tensor) else torch.empty(0, dtype=tensor.dtype)
            mine = _local(buffer)
            mine.set_(block.untyped_storage(), start // mine.element_size(), _local(tensor).shape)
            buffers.append(buffer)
        on_cuda = any(_local(tensor).device.type == "cuda" for tensor in tensors)
        if end and on_cuda and _host_register(block):
            self.registered.append(block)
        self.buffers = buffers

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
            # an OrderedDict's _metadata, an AttributeDict's fields
            if hasattr(value, "__dict__") and hasattr(out, "__dict__"):
                out.__dict__.update(copy.deepcopy(value.__dict__))
            return out
        if isinstance(value, list) and type(value) is list:
            return [self._copy(item, used) for item in value]
        if type(value) is tuple:
            return tuple(self._copy(item, used) for item in value)
        return copy.deepcopy(value)

    def _into(self, buffer: torch.Tensor, source: torch.Tensor) -> None:
        """``buffer.copy_(source)``: from CUDA on the device's side stream while :meth:`queue` runs (after what
        the loop's stream queued before); otherwise on the loop's stream, noted in ``devices`` to be waited for."""
        device = source.device
        if not _accelerated(device):
            buffer.copy_(source)
            return
        pinned = buffer.is_pinned() if not self.shared else device.type == "cuda"
        if self._streams is None or device.type != "cuda":  # queued on CUDA only: the one device they ran on
            self.devices.add(device)
            buffer.copy_(source, non_blocking=pinned)
            return
        stream = self._streams.get(device)
        if stream is None:
            stream = self._streams[device] = _side_stream(device)
            stream.wait_stream(torch.get_device_module(device).current_stream(device))
        with torch.get_device_module(device).stream(stream):
            buffer.copy_(source, non_blocking=pinned)
        source.record_stream(stream)

    def _tensor(self, tensor: torch.Tensor, used: list) -> torch.Tensor:
        """Called under ``torch.no_grad()``: a DTensor's ``to_local()`` is then its own local tensor, not an
        autograd view, and no ``detach()`` is needed for one (a DTensor's detach is dispatched through DTensor's
        operator machinery: 1,066 of them took 0.05 s of a 0.3 s save call on CPU, 2026-12-04)."""
        if _is_dtensor(tensor):
            return self._dtensor(tensor, used)
        tensor = tensor.detach()
        if not _buffered(tensor):
            return copy.deepcopy(tensor.cpu())  # a subclass or sparse tensor: torch copies it its own way
        index = used[0]
        used[0] += 1
        buffer = self.buffers[index] if index < len(self.buffers) else None
        if not _fits(buffer, tensor):
            buffer = self._new(tensor)
            self._put(index, buffer)
        self._into(buffer, tensor)
        return buffer

    def _new(self, tensor: torch.Tensor) -> torch.Tensor:
        if not self.shared:
            pinned = tensor.device.type != "cpu" and torch.accelerator.is_available()
            return torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=pinned)
        buffer = torch.empty(tensor.shape, dtype=tensor.dtype).share_memory_()
        if tensor.device.type == "cuda" and buffer.numel() and _host_register(buffer):
            self.registered.append(buffer)
        return buffer

    def _put(self, index: int, buffer) -> None:
        """Keep ``buffer`` at ``index``, unpinning the one it replaces (if sprite pinned it)."""
        old = self.buffers[index] if index < len(self.buffers) else None
        if old is not None:
            local = old.to_local() if _is_dtensor(old) else old
            if any(local is mine for mine in self.registered):
                torch.cuda.cudart().cudaHostUnregister(local.data_ptr())
                self.registered = [mine for mine in self.registered if mine is not local]
        self.buffers[index:index + 1] = [buffer]

    def _dtensor(self, tensor, used: list):
        """A DTensor whose local tensor is a host buffer (shared when ``shared``): copied to the CPU the first
        time (torch keeps the mesh and placements), then given each later save's copy of the local tensor."""
        index = used[0]
        used[0] += 1
        staged = self.buffers[index] if index < len(self.buffers) else None
        local = tensor.to_local()
        if not _fits(staged, tensor):
            staged = tensor.to("cpu", copy=True)  # a copy even from CPU, where .cpu() would be the tensor itself
            mine = staged.to_local()  # the DTensor's own local tensor (no autograd here)
            if self.shared:
                mine.share_memory_()
            if local.device.type == "cuda" and mine.numel() and _host_register(mine):
                self.registered.append(mine)
            self._put(index, staged)
            return staged
        self._into(staged.to_local(), local)
        return staged

    def release(self) -> None:
        """Unpin what was pinned and drop every buffer."""
        for buffer in self.registered:
            torch.cuda.cudart().cudaHostUnregister(buffer.data_ptr())
        self.registered, self.buffers = [], []


def _room(nbytes: int, again: bool) -> None:
    """Raises SaveFailed, before a byte is copied, where ``/dev/shm`` has less than ``nbytes`` free for a new block
    (``again``: one that replaces a block of an earlier save). Pages of shared memory are taken as they are first
    written, and one written past tmpfs's room kills the rank with SIGBUS, a death without a word of why. The
    process-mode writer was picked with room for the first save's state and a quarter spare
    (``sprite.runtime.ckpt.dcp_write.default_mode``); a state that grew since (a buffer the model made mid-fit, say)
    can lack it, the more so as torch's checkpoint process holds the previous block until the next save reaches it."""
    from sprite.runtime.ckpt import dcp_write

    free = dcp_write.shm_free()
    if free is None or free >= nbytes:
        return
    from sprite.errors import size_text
    from sprite.runtime.ckpt import durable

    held = " (torch's checkpoint process still holds the save before's copy of the state until this one reaches " \
           "it, and the state's layout changed since)" if again else ""
    raise durable.SaveFailed(
        f"A checkpoint was not saved: this rank's copy of the state needs {size_text(nbytes)} of shared memory for "
        f"torch's checkpoint process, and {dcp_write.SHM} has {size_text(free)} free{held}.",
        "The state grew since the process writer was picked, or other processes filled /dev/shm; the previous "
        "checkpoint is kept.",
        f"Give the job a larger {dcp_write.SHM}, or pass --checkpoint-writer thread, then resume with --resume auto.")


def _leaves(value):
    """The tensors in ``value``, in the order :meth:`HostCopy._copy` meets them."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _leaves(item)
    elif type(value) is list or type(value) is tuple:
        for item in value:
            yield from _leaves(item)


def _buffered(tensor) -> bool:
    """Whether ``tensor`` is staged into a buffer of :class:`HostCopy`: a DTensor, or one whose ``detach()`` is a plain
    strided tensor (a Parameter's is)."""
    if _is_dtensor(tensor):
        return True
    tensor = tensor.detach()
    return type(tensor) is torch.Tensor and tensor.layout == torch.strided


def _local(tensor) -> torch.Tensor:
    """A DTensor's local tensor (its own, under ``no_grad``), else the tensor."""
    return tensor.to_local() if _is_dtensor(tensor) else tensor


def _fits(buffer, tensor) -> bool:
    """Whether ``buffer`` can take ``tensor``'s copy: the same kind, shape and dtype (and a DTensor's placements,
    mesh and local shape)."""
    if buffer is None or _is_dtensor(buffer) != _is_dtensor(tensor) or buffer.shape != tensor.shape \
            or buffer.dtype != tensor.dtype:
        return False
    return not _is_dtensor(tensor) or (buffer.placements == tensor.placements
                                       and buffer.device_mesh == tensor.device_mesh
                                       and buffer.to_local().shape == tensor.to_local().shape)


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


def stager(shared: bool):
    """A :class:`Stager` (made here so that torch's staging module is imported only when one is needed)."""
    from concurrent.futures import Future, ThreadPoolExecutor

    from torch.distributed.checkpoint.staging import AsyncStager

    class Stager(AsyncStager):
        """torch's ``AsyncStager`` protocol for ``dcp.async_save``: stages into :class:`HostCopy`'s buffers
        (shared memory when ``shared``), kept from save to save; :meth:`stage` returns a ``Future`` of the copy,
        done once its queued device copies are (torch's executors wait for it before they plan or write)."""

        _synchronize_after_execute = False

        def __init__(self):
            self.host = HostCopy(shared=shared)
            self.waiter = None

        def stage(self, state_dict) -> Future:
            with torch.no_grad():
                out, ticket = self.host.queue(state_dict)
            if not ticket.events:
                done: Future = Future()
                done.set_result(out)
                return done
            if self.waiter is None:
                self.waiter = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sprite-stage-wait")
            return self.waiter.submit(lambda: (ticket.wait(), out)[1])

        def synchronize_staging(self) -> None:
            """Nothing to wait for here: the Future :meth:`stage` returned is done when the copies are."""

        def close(self) -> None:
            if self.waiter is not None:
                self.waiter.shutdown(wait=True)
                self.waiter = None
            self.host.release()

    return Stager()
