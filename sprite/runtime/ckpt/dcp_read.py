"""Lightning's sharded loads, read with fewer copies and no pure-Python unpickler per tensor.

Lightning 2.6.6 loads a torch.distributed.checkpoint folder with ``dcp.load`` and the default
``FileSystemReader`` (fabric/strategies/fsdp.py:879, called from fabric/strategies/model_parallel.py:444 and
:450 and from pytorch/strategies/fsdp.py:602). That reader reads each stored tensor through a Python file view
and ``torch.load(weights_only=True)``, whose unpickler is written in Python: on a 2-rank CPU load of the parity
recipe's qwen2.5-0.5b-shape state, the per-tensor ``torch.load`` took 0.76 s of the read's 1.02 s.

:class:`Reader` reads the same folder, written by torch's own ``FileSystemWriter``: runs of neighbouring items of
a file, each in one ``readinto`` (at most ``SPAN_BYTES``, or one item), on ``READ_THREADS`` threads ahead of the
copy into the model; each tensor from those bytes: the item's zip (the ``torch.save`` format) is indexed by
:func:`zip_records`, its small ``data.pkl`` is read by the C unpickler with only a plain tensor's few names allowed,
and the stored bytes are copied into the model's tensor. An item it does not read so (a transform, another
layout, another byte order, any name but those, a damaged zip) is read as torch's reader reads it, by
``torch.load(weights_only=True)``, which refuses what it always refused. :func:`load` plans each rank's read on
that rank (torch's default load planner coordinates none), agrees on the outcome in one gather, and lets a
stored non-tensor value through only if the weights-only unpickler accepts it.
"""

from __future__ import annotations

import collections
import concurrent.futures
import importlib
import io
import os
import pickle
import struct
import sys

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.planner import LoadItemType

from sprite.integrity import IntegrityError, dcp_metadata, records

# Bytes read in one call at most, into buffers reused call after call, so that their pages are faulted in once
# (a longer item is read whole into a buffer of its own, as torch's reader would).
SPAN_BYTES = 64 << 20
# Threads that read ahead of the copy into the model, each into its own SPAN_BYTES buffer
READ_THREADS = 2
# Items further apart than this in a file are read in separate calls
GAP_BYTES = 1 << 20


class _Unknown(Exception):
    """The item is not a plain tensor in torch.save's format: read it as torch's reader does."""


_Storage = collections.namedtuple("_Storage", "dtype key numel")
# What reading an item's zip and data.pkl raises when they are not a plain tensor in torch.save's format: sprite's
# own refusal, the C unpickler's errors on a damaged or different pickle (a wrong argument count is a TypeError), a
# missing record (KeyError), a truncated zip (struct.error, IndexError).
_UNREADABLE = (_Unknown, pickle.UnpicklingError, EOFError, ValueError, TypeError, KeyError, IndexError,
               AttributeError, OverflowError, struct.error)


class _StorageType:
    def __init__(self, name: str):
        try:
            self.dtype = torch.storage._get_dtype_from_pickle_storage_type(name)
        except KeyError:
            raise _Unknown(name) from None


def _rebuild(storage, offset, size, stride, requires_grad, hooks, *more):
    if more or hooks or not isinstance(storage, _Storage):
        raise _Unknown("not a plain tensor")
    return storage, offset, tuple(size), tuple(stride)


class _Unpickler(pickle.Unpickler):
    """The C unpickler, allowed only the names a plain tensor's ``data.pkl`` holds."""

    def find_class(self, module, name):
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return _rebuild
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        if module == "torch" and name.endswith("Storage"):
            return _StorageType(name)
        raise _Unknown(f"{module}.{name}")

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"
                and isinstance(pid[1], _StorageType) and isinstance(pid[2], str) and isinstance(pid[4], int)):
            raise _Unknown("storage id")
        return _Storage(pid[1].dtype, pid[2], pid[4])


def zip_records(raw: memoryview) -> dict[str, tuple[int, int]]:
    """Where the records of the zip in ``raw`` are (offset, length), by name without the one folder they are in
    (torch.save's format: stored, not compressed). Raises _Unknown for any other zip (a comment, ZIP64 sizes,
    compression), which torch then reads itself."""
    end = len(raw) - 22
    if end < 0 or raw[end:end + 4] != b"PK\x05\x06":
        raise _Unknown("end of the zip")
    count, size, start, comment = struct.unpack_from("<10xHIIH", raw, end)
    if comment or count == 0xFFFF or 0xFFFFFFFF in (size, start) or start + size > end:
        raise _Unknown("zip directory")
    records, folder, at = {}, None, start
    for _ in range(count):
        if raw[at:at + 4] != b"PK\x01\x02":
            raise _Unknown("zip entry")
        method, packed, length, name_len, extra_len, note_len, header = struct.unpack_from("<10xH8xIIHHH8xI", raw,
                                                                                            at)
        name = bytes(raw[at + 46:at + 46 + name_len]).decode("utf-8", "replace")
        at += 46 + name_len + extra_len + note_len
        prefix, _, record = name.partition("/")
        if method != 0 or packed != length or 0xFFFFFFFF in (length, header) or folder not in (None, prefix):
            raise _Unknown("zip record")
        folder = prefix
        if raw[header:header + 4] != b"PK\x03\x04":
            raise _Unknown("zip record header")
        local_name, local_extra = struct.unpack_from("<26xHH", raw, header)
        data = header + 30 + local_name + local_extra
        if data + length > start:
            raise _Unknown("zip record past the directory")
        records[record] = (data, length)
    return records


class _Stored(collections.namedtuple("_Stored", "data dtype offset size stride")):
    """One stored tensor: its storage's bytes (a uint8 view of the buffer read), dtype and layout."""

    @property
    def dense(self) -> bool:
        """Whether the tensor is its whole storage in row-major order (then its bytes are its values)."""
        expect = 1
        for n, step in reversed(list(zip(self.size, self.stride))):
            if n != 1 and step != expect:
                return False
            expect *= n
        return self.offset == 0 and expect * self.dtype.itemsize == self.data.numel()

    def tensor(self) -> torch.Tensor:
        """The tensor, a view of the buffer where its bytes are aligned for the dtype, else of a copy of them."""
        data = self.data
        if data.data_ptr() % self.dtype.itemsize:
            data = data.clone()
        flat = data.view(self.dtype)
        return flat.as_strided(self.size, self.stride, flat.storage_offset() + self.offset)


def _stored(span: torch.Tensor, start: int, length: int) -> _Stored:
    """The tensor that torch.save wrote at ``span[start:start + length]``. Raises _Unknown for anything but a
    plain dense tensor in the format :func:`zip_records` reads."""
    raw = span[start:start + length]
    view = memoryview(raw.numpy())
    records = zip_records(view)

    def record(name: str) -> bytes:
        where, size = records[name]
        return bytes(view[where:where + size])

    if "data.pkl" not in records or ("byteorder" in records and record("byteorder") != sys.byteorder.encode()):
        raise _Unknown("byte order")
    found = _Unpickler(io.BytesIO(record("data.pkl"))).load()
    if not (isinstance(found, tuple) and len(found) == 4):
        raise _Unknown("data.pkl")
    storage, offset, size, stride = found
    where, nbytes = records.get(f"data/{storage.key}", (0, -1))
    if nbytes != storage.numel * storage.dtype.itemsize:
        raise _Unknown("storage size")
    if len(size) != len(stride) or min(stride, default=0) < 0 or min(size, default=0) < 0 or offset < 0:
        raise _Unknown("shape")
    if 0 not in size and offset + sum((n - 1) * s for n, s in zip(size, stride)) >= storage.numel:
        raise _Unknown("out of the storage")
    return _Stored(raw[where:where + nbytes], storage.dtype, offset, size, stride)


def _spans(items: list[tuple[int, int, object]]) -> list[list[tuple[int, int, object]]]:
    """``items`` (offset, length, request), sorted, cut into runs read in one call each."""
    runs: list[list] = []
    for item in sorted(items, key=lambda entry: entry[0]):
        if runs:
            first, last = runs[-1][0], runs[-1][-1]
            end = item[0] + item[1]
            if item[0] - (last[0] + last[1]) <= GAP_BYTES and end - first[0] <= SPAN_BYTES:
                runs[-1].append(item)
                continue
        runs.append([item])
    return runs


def _read(stream, start: int, size: int, buffer: torch.Tensor) -> torch.Tensor:
    """``size`` bytes of ``stream`` from ``start``, in ``buffer`` when it is large enough."""
    span = buffer[:size] if size <= buffer.numel() else torch.empty(size, dtype=torch.uint8)
    view, done = memoryview(span.numpy()), 0
    stream.seek(start)
    while done < size:
        got = stream.readinto(view[done:])
        if not got:
            raise OSError(f"the checkpoint file ended {size - done} bytes early")
        done += got
    return span


def read_metadata(path):
    """The torch Metadata pickled in the file ``path`` (a checkpoint folder's ``.metadata``), unpickled with
    only the names torch's metadata holds (``sprite.integrity.dcp_metadata``): a crafted file runs no code.

    Raises:
        IntegrityError: the file names anything else, is no regular file, is too large or is not a pickle.
    """
    from torch.distributed.checkpoint.metadata import Metadata

    try:
        found = dcp_metadata.load(records.read(path, dcp_metadata.METADATA_MAX), _resolve)
        if not isinstance(found, Metadata):
            raise ValueError(f"it holds a {type(found).__name__}, not torch's Metadata")
    except (OSError, ValueError) as err:
        raise IntegrityError(f"The checkpoint metadata {path} is refused, never unpickled: "
                             f"{getattr(err, 'strerror', None) or err}.", "torch's own metadata holds only"
                             " torch's checkpoint classes: the file was crafted or damaged.",
                             "Use a checkpoint you trust.") from None
    return found


def _resolve(module: str, name: str):
    """An allowed name (dcp_metadata.ALLOWED, checked before this is called) as torch defines it."""
    return getattr(importlib.import_module(module), name)


class Reader(FileSystemReader):
    """torch's FileSystemReader with a faster ``read_data`` (module docstring) and a ``read_metadata`` that
    unpickles only torch's metadata classes."""

    def read_metadata(self, *args, **kwargs):
        """torch's ``read_metadata`` (filesystem.py:926, torch 2.13) through :func:`read_metadata`."""
        from torch.distributed.checkpoint.metadata import StorageMeta

        rank = kwargs.get("rank")
        if hasattr(self, "_get_metadata_path"):  # torch 2.13's private helper: "__<rank>.metadata" with a rank
            path = self._get_metadata_path(rank)
        else:
            path = os.path.join(self.path, ".metadata" if rank is None else f"__{rank}.metadata")
        metadata = read_metadata(path)
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = getattr(self, "load_id", None)
        return metadata

    def read_data(self, plan, planner):
        per_file: dict[str, list] = {}
        for request in plan.items:
            info = self.storage_data[request.storage_index]
            per_file.setdefault(info.relative_path, []).append((info.offset, info.length, request))
        runs = [(relative, run) for relative, items in per_file.items() for run in _spans(items)]
        # READ_THREADS threads read the next runs, each into its own buffer, while this thread copies a run out of
        # another: run i's buffer is taken again by run i + READ_THREADS + 1, started once run i is copied out
        buffers = [torch.empty(0, dtype=torch.uint8) for _ in range(READ_THREADS + 1)]
        with concurrent.futures.ThreadPoolExecutor(READ_THREADS, thread_name_prefix="sprite-dcp-read") as pool:
            pending = {index: self._fetch(pool, *runs[index], buffers, index)
                       for index in range(min(READ_THREADS, len(runs)))}
            for index, (_, run) in enumerate(runs):
                span = pending.pop(index).result()
                if index + READ_THREADS < len(runs):
                    later = index + READ_THREADS
                    pending[later] = self._fetch(pool, *runs[later], buffers, later)
                for offset, length, request in run:
                    self._one(planner, request, span, offset - run[0][0], length)
        future = torch.futures.Future()
        future.set_result(None)
        return future

    def _fetch(self, pool, relative: str, run: list, buffers: list, index: int) -> concurrent.futures.Future:
        """Start reading ``run`` of the file ``relative`` into the ``index``-th buffer, round the list (allocated
        here, on the caller's thread, when the run fits in SPAN_BYTES); the future gives the bytes read."""
        base = run[0][0]
        size = run[-1][0] + run[-1][1] - base
        slot = index % len(buffers)
        if buffers[slot].numel() < min(size, SPAN_BYTES):
            buffers[slot] = torch.empty(SPAN_BYTES, dtype=torch.uint8)
        buffer = buffers[slot]

        def read() -> torch.Tensor:
            with self.fs.create_stream(self.fs.concat_path(self.path, relative), "rb") as stream:
                return _read(stream, base, size, buffer)

        return pool.submit(read)

    def _one(self, planner, request, span: torch.Tensor, start: int, length: int) -> None:
        info = self.storage_data[request.storage_index]
        if request.type == LoadItemType.BYTE_IO or info.transform_descriptors:
            return self._as_torch(planner, request, span, start, length)
        try:
            stored = _stored(span, start, length)
        except _UNREADABLE:  # what this cannot read, torch reads or refuses as it always did
            return self._as_torch(planner, request, span, start, length)
        target = planner.resolve_tensor(request).detach()
        whole = not any(request.storage_offsets) and tuple(request.lengths) == stored.size == tuple(target.size())
        as_bytes = None
        if whole and stored.dense and target.dtype == stored.dtype and target.is_contiguous():
            try:
                as_bytes = target.view(-1).view(torch.uint8)
            except RuntimeError:  # a dtype torch does not view as bytes (complex)
                as_bytes = None
        if as_bytes is not None:
            as_bytes.copy_(stored.data)  # the stored bytes are the values: aligned or not, to the target's device
            planner.commit_tensor(request, target)
        else:
            _commit(planner, request, stored.tensor())

    def _as_torch(self, planner, request, span, start, length) -> None:
        """What torch's reader does with one item (filesystem.py read_data), from the bytes already read."""
        info = self.storage_data[request.storage_index]
        source = io.BytesIO(span[start:start + length].numpy().tobytes())
        stream = self.transforms.transform_load_stream(request, info.transform_descriptors or (), source)
        if request.type == LoadItemType.BYTE_IO:
            planner.load_bytes(request, io.BytesIO(stream.read(-1)))
            return
        seekable = stream if stream.seekable() else io.BytesIO(stream.read(-1))
        _commit(planner, request, torch.load(seekable, map_location="cpu", weights_only=True))


def _commit(planner, request, tensor: torch.Tensor) -> None:
    """Copy the stored ``tensor`` into the state's own tensor, as torch's reader does."""
    from torch.distributed._shard._utils import narrow_tensor_by_index

    tensor = narrow_tensor_by_index(tensor, request.storage_offsets, request.lengths)
    target = planner.resolve_tensor(request).detach()
    if target.size() != tensor.size():
        raise AssertionError(f"req {request.storage_index} mismatch sizes {target.size()} vs {tensor.size()}")
    target.copy_(tensor)
    planner.commit_tensor(request, target)


def _weights_only_planner(base=None):
    """torch's DefaultLoadPlanner (or ``base``, a subclass of it), except that a stored non-tensor value (an
    optimizer's param_groups, say) must pass ``torch.load(weights_only=True)`` before torch's own ``load_bytes``
    unpickles it: that one uses ``weights_only=False`` (default_planner.py, ``load_bytes``), so a crafted
    checkpoint could run code through it. What passes holds only what the weights-only unpickler allows, so
    torch's second reading builds the same objects."""
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

    class WeightsOnlyPlanner(base or DefaultLoadPlanner):
        def load_bytes(self, read_item, value):
            data = value.read()
            torch.load(io.BytesIO(data), weights_only=True)  # raises pickle.UnpicklingError for anything else
            super().load_bytes(read_item, io.BytesIO(data))

    return WeightsOnlyPlanner()


def load_whole(path) -> dict:
    """Every value stored in the checkpoint folder ``path``, in one process: torch's ``dcp_to_torch_save``
    (format_utils.py:208, torch 2.13) without the file, read by :class:`Reader` and the weights-only planner, so
    neither ``.metadata`` nor a stored value can run code (torch's own passes ``weights_only=False``).

    torch offers no public way to load a folder without a state dict to load into; its converter uses the two
    private names below (torch 2.13). Without them this refuses rather than unpickle unchecked.

    Raises:
        IntegrityError: ``.metadata`` names anything but torch's metadata classes (exit 1). RuntimeError: this
            torch lacks the private names. pickle.UnpicklingError (inside torch's CheckpointException): a stored
            value is more than plain data.
    """
    try:
        from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
        from torch.distributed.checkpoint.state_dict_loader import _load_state_dict
    except ImportError as err:  # renamed in a later torch: checked with 2.13 only
        raise RuntimeError(f"torch {torch.__version__} has no {err.name}: sprite reads whole checkpoint folders"
                           " with torch 2.13's private converter names only") from None
    from sprite.runtime.ckpt import gcpause

    state: dict = {}
    with gcpause.paused_gc():
        _load_state_dict(state, storage_reader=Reader(path),
                         planner=_weights_only_planner(_EmptyStateDictLoadPlanner), no_dist=True)
    return state


def load(state: dict, path) -> None:
    """Lightning's ``_distributed_checkpoint_load`` with :class:`Reader` and :func:`_weights_only_planner`. Every
    rank calls it, as Lightning does.

    torch's default load planner plans no read across ranks (default_planner.py,
    ``create_default_global_load_plan`` returns the ranks' own plans), yet ``dcp.load`` gathers every rank's plan
    on rank 0 and scatters it back, pickled, and gathers every rank's outcome after the read. Here each rank plans
    and reads alone (``no_dist``), and one gather then tells every rank whether all of them loaded, so a rank
    that failed fails them all, as it does in ``dcp.load``.

    Raises:
        RuntimeError: another rank failed to load (this rank's own error is raised as it is).
    """
    from torch.distributed.checkpoint import load as dcp_load
    from torch.distributed.checkpoint.api import CheckpointException  # a BaseException

    from sprite.runtime import allranks

    from sprite.runtime.ckpt import gcpause

    error: BaseException | None = None
    try:
        with gcpause.paused_gc():
            dcp_load(state, storage_reader=Reader(path), planner=_weights_only_planner(), no_dist=True)
    except (Exception, CheckpointException) as failure:  # noqa: BLE001 - told to the other ranks, then raised
        error = failure
    failed = [(rank, text) for rank, text in enumerate(allranks.gather(None if error is None else
                                                                         f"{type(error).__name__}: {error}"[:500]))
              if text is not None]
    if error is not None:
        raise error
    if failed:
        rank, text = failed[0]
        raise RuntimeError(f"rank {rank} could not load the sharded checkpoint {path}: {text}")


def install() -> None:
    """Route Lightning's sharded loads through :func:`load` (idempotent)."""
    from lightning.fabric.strategies import fsdp as fabric_fsdp
    from lightning.fabric.strategies import model_parallel
    from lightning.pytorch.strategies import fsdp

    for module in (fabric_fsdp, model_parallel, fsdp):
        module._distributed_checkpoint_load = load
