"""Lightning's sharded saves, written without a ``torch.save`` call and a CRC-32 per tensor.

torch's ``FileSystemWriter`` writes every item of a rank's shard file with its own ``torch.save``
(torch/distributed/checkpoint/filesystem.py, ``_write_item``). That costs twice over:
- ``torch.save`` is slow for a small tensor: 138 us each on a 2-core CPU, and the parity recipe's
  qwen2.5-0.5b-shape state holds about 5,300 items a rank on 2 ranks (LoRA weights and their Adam moments).
- Every byte goes through the zip's CRC-32: ``torch.save`` of 512 MiB took 0.30 s with it and 0.14 s without it,
  about what writing the bytes alone took (docs/runs/cpu-2026-11-30/probe_torch_save.*). ``torch.load`` does not
  check that CRC (a flipped data byte loads without a complaint), while sprite's manifest covers every byte with
  SHA-256.

:class:`Writer` writes the same folder: torch's planning and ``.metadata`` (``finish``), and one
``__<rank>_0.distcp`` file a rank, created new and never through a symlink. Each plain tensor is the archive
``torch.save`` writes for it: the same records in the same order, the same ``data.pkl`` byte for byte, the data
aligned as torch aligns it. Its CRC-32 fields are zero, as ``torch.save`` writes them with
``torch.utils.serialization.config.save.compute_crc32`` off. The records are taken from a ``torch.save`` of a
small tensor at each save, so they follow the installed torch; if its ``data.pkl`` is not the one this module
builds, every item goes through ``torch.save``.

Device tensors are copied to the host in batches on the calling thread (non-blocking copies, as torch's own
writer makes them, then one wait a batch) while one more thread writes the batch before. The file's
``digest.CHUNK`` pieces are hashed as they are written (``digest.Growing``), so the seal reads none of them
again; the fsync is left to the seal.
Anything else goes through ``torch.save``: a tensor subclass, a sparse or quantized tensor, a dtype without a
storage name, an archive over 4 GiB, a big-endian host.
"""

from __future__ import annotations

import collections
import concurrent.futures
import io
import math
import os
import pickle
import secrets
import struct
import sys

import torch
from torch.distributed.checkpoint import FileSystemWriter
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.planner import WriteItemType
from torch.distributed.checkpoint.storage import WriteResult

from sprite.integrity import digest
from sprite.integrity.writeonce import created, write_all

# Bytes copied to the host before they are handed to the writing thread (a larger tensor is a batch of its own)
BATCH_BYTES = 64 << 20
# Pieces smaller than this are gathered and written together
_SMALL = 1 << 20
_ALIGN = 64  # torch.save aligns each record's data to 64 bytes of its archive (config.save.storage_alignment)
_LIMIT = 0xFFFFFFFF  # past this, a zip needs ZIP64 fields: torch.save writes those archives


class _Storage:
    """Pickled as torch.save pickles a tensor's storage: by its persistent id."""

    def __init__(self, kind, numel: int):
        self.kind, self.numel = kind, numel


class _Tensor:
    """Pickled as torch.save pickles a dense tensor with its own storage (``Tensor._reduce_ex_internal``)."""

    def __init__(self, dtype: torch.dtype, shape: tuple, names: dict):
        stride, step = [], 1
        for n in reversed(shape):
            stride.append(step)
            step *= n
        self.storage = _Storage(getattr(torch, names[dtype]), step)  # step: the product of the sizes
        self.shape, self.stride = shape, tuple(reversed(stride))

    def __reduce__(self):
        return (torch._utils._rebuild_tensor_v2,
                (self.storage, 0, self.shape, self.stride, False, collections.OrderedDict()))


class _Pickler(pickle.Pickler):
    def persistent_id(self, obj):
        if isinstance(obj, _Storage):
            return ("storage", obj.kind, "0", "cpu", obj.numel)
        return None


def _data_pkl(dtype: torch.dtype, shape: tuple, names: dict) -> bytes:
    out = io.BytesIO()
    _Pickler(out, protocol=2).dump(_Tensor(dtype, shape, names))  # torch.serialization.DEFAULT_PROTOCOL
    return out.getvalue()


def _zip(records: list[tuple[str, object]]) -> tuple[bytes, bytes]:
    """A stored zip of ``records`` (name, bytes, or an int: that many bytes the caller writes in between), as
    (everything before those bytes, everything after). Each record's data starts at a multiple of ``_ALIGN``
    from the archive's start, padded by an ``FB`` extra field as torch's writer pads it. Raises OverflowError
    past the plain zip's 4 GiB."""
    head, central, at, parts = bytearray(), bytearray(), 0, []
    for name, payload in records:
        raw = name.encode()
        size = payload if isinstance(payload, int) else len(payload)
        pad = -(at + 30 + len(raw) + 4) % _ALIGN
        extra = b"FB" + struct.pack("<H", pad) + b"Z" * pad
        if max(size, at) >= _LIMIT:
            raise OverflowError("a zip over 4 GiB")
        head += struct.pack("<IHHHHHIIIHH", 0x04034B50, 0, 0, 0, 0, 0, 0, size, size, len(raw), len(extra))
        head += raw + extra
        central += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 0, 0, 0, 0, 0, 0, 0, size, size, len(raw), 0, 0, 0,
                               0, 0, at) + raw
        at += 30 + len(raw) + len(extra) + size
        if isinstance(payload, int):
            parts.append(bytes(head))
            head = bytearray()
        else:
            head += payload
    if at >= _LIMIT:
        raise OverflowError("a zip over 4 GiB")
    head += central + struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, len(records), len(records), len(central), at, 0)
    parts.append(bytes(head))
    if len(parts) != 2:
        raise ValueError("one record is written by the caller")
    return parts[0], parts[1]


class _Format:
    """The records torch.save writes for one tensor, learned from a torch.save of a small one."""

    def __init__(self):
        from sprite.runtime.ckpt.dcp_read import zip_records

        self.names = {dtype: name for dtype, name in torch.storage._dtype_to_storage_type_map().items()}
        sample = torch.zeros(2, 3)
        out = io.BytesIO()
        torch.save(sample, out)
        raw = memoryview(out.getvalue())
        found = zip_records(raw)
        self.folder = self._folder(raw)
        self.records = [(name, bytes(raw[at:at + size])) for name, (at, size) in found.items()]
        self.id = f"{secrets.randbits(128):040d}"[-40:]
        self.frames: dict[tuple, tuple[bytes, bytes]] = {}
        names = [name for name, _ in self.records]
        self.usable = ("data.pkl" in names and "data/0" in names and sys.byteorder == "little"
                       and dict(self.records)["data.pkl"] == _data_pkl(sample.dtype, (2, 3), self.names))

    @staticmethod
    def _folder(raw: memoryview) -> str:
        start = struct.unpack_from("<I", raw, len(raw) - 6)[0]
        length = struct.unpack_from("<H", raw, start + 28)[0]
        return bytes(raw[start + 46:start + 46 + length]).decode().partition("/")[0]

    def frame(self, dtype: torch.dtype, shape: tuple, nbytes: int) -> tuple[bytes, bytes]:
        """(before, after) the tensor's bytes in its archive. Raises KeyError (no storage name for the dtype)
        or OverflowError (over 4 GiB)."""
        key = (dtype, shape)
        if key not in self.frames:
            records = []
            for name, payload in self.records:
                if name == "data.pkl":
                    payload = _data_pkl(dtype, shape, self.names)
                elif name == "data/0":
                    payload = nbytes
                elif name == ".data/serialization_id":
                    payload = self.id.encode()
                records.append((f"{self.folder}/{name}", payload))
            self.frames[key] = _zip(records)
        return self.frames[key]


def _bytes(tensor: torch.Tensor):
    """A host tensor's values in row-major order, as a byte buffer (raises RuntimeError where torch cannot view
    them as bytes)."""
    flat = tensor.contiguous().reshape(-1)
    return memoryview(flat.view(torch.uint8).numpy()) if flat.numel() else b""


def _torch_save(tensor: torch.Tensor) -> bytes:
    """The item as torch's writer writes it (``_SerialCpuLoader`` and ``_write_item``)."""
    tensor = tensor.cpu()
    if tensor.untyped_storage().size() != tensor.nbytes:
        tensor = tensor.clone()
    out = io.BytesIO()
    torch.save(tensor, out)
    return out.getvalue()


class _Sink:
    """The shard file, written in order by one thread; its pieces are handed to the hasher as they land."""

    def __init__(self, fd: int):
        self.fd, self.pending, self.done = fd, bytearray(), 0
        self.growing = digest.Growing(fd)

    def put(self, parts: list) -> None:
        for part in parts:
            if len(part) < _SMALL:
                self.pending += part
                if len(self.pending) >= _SMALL:
                    self.flush()
            else:
                self.flush()
                write_all(self.fd, part)
                self.done += len(part)
                self.growing.written(self.done)

    def flush(self) -> None:
        if self.pending:
            write_all(self.fd, self.pending)
            self.done += len(self.pending)
            self.pending = bytearray()
            self.growing.written(self.done)


class Writer(FileSystemWriter):
    """torch's FileSystemWriter with sprite's ``write_data`` (module docstring). After a save, ``entries`` maps
    each shard file this rank wrote to its ``sprite.integrity.digest`` description."""

    def __init__(self, path):
        super().__init__(path, single_file_per_rank=True, sync_files=False, thread_count=1)
        self.entries: dict[str, dict] = {}

    def write_data(self, plan, planner):
        name = f"{plan.storage_data.prefix}0.distcp"  # filesystem.py's file name (DEFAULT_SUFFIX)
        path = os.path.join(self.path, name)
        tensors = [item for item in plan.items if item.type != WriteItemType.BYTE_IO]
        results, at = [], 0
        form = _Format()
        with created(path, mode=None, readable=True, sync=False) as fd, \
                concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="sprite-dcp-write") as pool:
            sink, pending = _Sink(fd), collections.deque()
            try:
                batch: list = []
                for item in plan.items:
                    if item.type == WriteItemType.BYTE_IO:
                        batch.append(planner.resolve_data(item).getbuffer())
                        results.append(self._result(item, name, at, len(batch[-1])))
                        at += len(batch[-1])
                for group in self._groups(tensors):
                    for item, parts in self._host(form, planner, group):
                        size = sum(len(part) for part in parts)
                        results.append(self._result(item, name, at, size))
                        at += size
                        batch.extend(parts)
                    pending.append(pool.submit(sink.put, batch))
                    batch = []
                    while len(pending) > 1:  # at most one batch copied ahead of the one being written
                        pending.popleft().result()
                pending.append(pool.submit(sink.put, batch))
                while pending:
                    pending.popleft().result()
                sink.flush()
                self.entries[path] = sink.growing.entry()
            finally:
                sink.growing.close()
        future = torch.futures.Future()
        future.set_result(results)
        return future

    @staticmethod
    def _result(item, name: str, offset: int, length: int) -> WriteResult:
        return WriteResult(index=item.index, size_in_bytes=length, storage_data=_StorageInfo(name, offset, length))

    @staticmethod
    def _groups(items: list) -> list[list]:
        """``items`` in batches of about ``BATCH_BYTES`` of tensor data."""
        groups, size = [], 0
        for item in items:
            nbytes = math.prod(item.tensor_data.chunk.sizes) * item.tensor_data.properties.dtype.itemsize
            if not groups or size + nbytes > BATCH_BYTES:
                groups.append([])
                size = 0
            groups[-1].append(item)
            size += nbytes
        return groups

    @staticmethod
    def _host(form: _Format, planner, group: list) -> list[tuple[object, list]]:
        """Each item of ``group`` as the pieces of its archive, its tensor copied to the host (the copies of a
        device's tensors are started together, then waited for once)."""
        copies, devices = [], set()
        for item in group:
            tensor = planner.resolve_data(item).detach()
            if tensor.device.type != "cpu":
                devices.add(tensor.device)
                tensor = tensor.to("cpu", non_blocking=True)
            copies.append((item, tensor))
        for device in devices:
            torch.get_device_module(device).synchronize(device)
        out = []
        for item, tensor in copies:
            try:
                if not (form.usable and type(tensor) is torch.Tensor and tensor.layout == torch.strided
                        and not tensor.is_quantized):
                    raise KeyError("not a plain tensor")
                data = _bytes(tensor)
                before, after = form.frame(tensor.dtype, tuple(tensor.shape), len(data))
                out.append((item, [before, data, after]))
            except (KeyError, OverflowError, RuntimeError):
                out.append((item, [_torch_save(tensor)]))
        return out
