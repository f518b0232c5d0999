"""The ``.metadata`` pickle of a torch.distributed.checkpoint folder, read with only torch's own metadata classes.

torch's ``FileSystemReader.read_metadata`` (filesystem.py:926 in torch 2.13) runs ``pickle.load`` on the file, so
a crafted ``.metadata`` runs any code it names. A sprite manifest cannot stop that: it is an unkeyed SHA-256, and
anyone who can write the folder can replace the file and seal the folder again. sprite therefore reads
``.metadata`` only through :class:`Unpickler`, which resolves nothing but :data:`ALLOWED`: the names that torch's
own metadata holds, listed by pickling the metadata torch wrote for models, optimizers and every storable dtype
(torch :data:`TORCH_CHECKED`). Anything else is refused with the name it asked for, before any of it runs.

:func:`check` needs no torch (``sprite ckpt verify`` on a login node): the allowed names resolve to inert
stand-ins, so nothing but this module's own code runs. The runtime resolves them to torch's real classes
(``sprite.runtime.ckpt.dcp_read``). A newer torch that pickles another name is refused too, naming it: add it
here once it is checked to be data only. Stdlib only.
"""

from __future__ import annotations

import io
import pickle
from typing import Callable

TORCH_CHECKED = "2.13.0"
METADATA_MAX = 1 << 30  # bytes of .metadata read at most (the metadata of a large sharded model is tens of MB)

_META = "torch.distributed.checkpoint.metadata"
_DTYPES = ("bfloat16", "bool", "complex128", "complex32", "complex64", "float16", "float32", "float64",
           "float4_e2m1fn_x2", "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz",
           "float8_e8m0fnu", "int16", "int32", "int64", "int8", "uint16", "uint32", "uint64", "uint8")
ALLOWED = frozenset({
    *((_META, name) for name in ("Metadata", "MetadataIndex", "StorageMeta", "TensorStorageMetadata",
                                 "BytesStorageMetadata", "ChunkStorageMetadata", "TensorProperties",
                                 "_MEM_FORMAT_ENCODING")),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),  # a layout by its name ("torch.strided"): a dict lookup
    ("pathlib", "PosixPath"), ("pathlib", "PurePosixPath"),  # StorageMeta.checkpoint_id
    *(("torch", name) for name in _DTYPES),
})


class Refused(pickle.UnpicklingError):
    """The pickle names something torch's checkpoint metadata never holds."""


class _Inert:
    """What :func:`check` builds for an allowed name: accepts any arguments and state, does nothing."""

    def __new__(cls, *args, **kwargs):
        return object.__new__(cls)

    def __init__(self, *args, **kwargs):
        pass

    def __setstate__(self, state):
        pass


def _inert(module: str, name: str):
    return type(name, (_Inert,), {"__module__": "sprite.inert"})


class Unpickler(pickle.Unpickler):
    """The C unpickler resolving only :data:`ALLOWED`, through ``resolve(module, name)``."""

    def __init__(self, file, resolve: Callable[[str, str], object] = _inert):
        super().__init__(file)
        self._resolve = resolve

    def find_class(self, module, name):
        if (module, name) not in ALLOWED:
            raise Refused(f"it names {module}.{name}"[:200] + ", which torch's checkpoint metadata never holds"
                          f" (checked against torch {TORCH_CHECKED})")
        return self._resolve(module, name)

    def persistent_load(self, pid):
        raise Refused("it holds a persistent id, which torch's checkpoint metadata never holds")


def load(data: bytes, resolve: Callable[[str, str], object] = _inert):
    """The unpickled ``data``. Raises ValueError (naming the refused global, or how the pickle is broken)."""
    try:
        return Unpickler(io.BytesIO(data), resolve).load()
    except Refused as err:
        raise ValueError(str(err)) from None
    except Exception as err:  # noqa: BLE001 - a broken pickle: whatever the C unpickler raised, on one line
        raise ValueError(f"it is not a readable pickle ({type(err).__name__}: {str(err)[:120]})") from None


def check(data: bytes) -> str:
    """"" when ``data`` is a pickle of torch checkpoint metadata only, else what is wrong with it. Torch-free;
    runs no code from ``data``."""
    try:
        load(data)
    except ValueError as err:
        return str(err)
    return ""
