"""Do ranks train on the same data? A digest of each rank's first training batch, compared with one all-gather.

The digest reads at most ``CAP_BYTES`` of each tensor (copied to the host), enough to tell sharded rows apart.
The all-gather moves two int64 values per rank: the digest and the rank's data-parallel index, so ranks of one
tensor-parallel group (which must share a batch) are not reported.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

import torch
import torch.distributed as dist

CAP_BYTES = 1 << 20


def _feed(h, obj) -> None:
    if isinstance(obj, torch.Tensor):
        h.update(f"T{obj.dtype}{tuple(obj.shape)}".encode())
        try:
            flat = obj.detach().reshape(-1)
            flat = flat[: CAP_BYTES // flat.element_size()].cpu().contiguous()
            h.update(flat.view(torch.uint8).numpy().tobytes())
        except (RuntimeError, TypeError):  # sparse, quantized or nested tensors: shape and dtype only
            pass
    elif isinstance(obj, Mapping):
        h.update(b"M")
        for key in sorted(obj, key=str):
            h.update(str(key).encode())
            _feed(h, obj[key])
    elif isinstance(obj, (list, tuple)):
        h.update(f"L{len(obj)}".encode())
        for item in obj:
            _feed(h, item)
    elif hasattr(obj, "tobytes"):  # numpy arrays and scalars
        h.update(obj.tobytes())
    else:
        h.update(repr(obj).encode())


def digest(batch) -> int:
    """A 64-bit digest (signed, fits int64) of a batch: tensors, mappings, sequences, numpy arrays, scalars."""
    h = hashlib.blake2b(digest_size=8)
    _feed(h, batch)
    return int.from_bytes(h.digest(), "little", signed=True)


def shared_groups(digests: list[int], dp_ranks: list[int]) -> list[list[int]]:
    """Groups of global ranks that got the same digest although they are different data-parallel ranks."""
    by_digest: dict[int, list[int]] = {}
    for rank, value in enumerate(digests):
        by_digest.setdefault(value, []).append(rank)
    return sorted(ranks for ranks in by_digest.values() if len({dp_ranks[r] for r in ranks}) > 1)


def gather(values: list[int], device: torch.device) -> list[list[int]]:
    """Every rank's ``values`` (int64), in rank order: one all-gather over the default process group."""
    mine = torch.tensor(values, dtype=torch.int64, device=device)
    everyone = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, mine)
    return [t.tolist() for t in everyone]
