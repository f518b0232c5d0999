"""The collectives of background saves, on a gloo process group of their own, and the waits at the end of a fit.

A background save's collectives (torch's planning inside ``dcp.async_save``, sprite's gather of every rank's
file hashes and the broadcast of the outcome) run on a background thread while the training loop runs its own
collectives. On one process group the two streams could interleave differently on different ranks; torch's
``dcp.async_save`` documentation asks for a separate gloo group for that reason. :func:`group` makes it once,
at the first save (every rank saves, so every rank makes it in the same order).
"""

from __future__ import annotations

import sys

_group: list = []  # [the group] once made ([None]: no process group of more than one rank)


def group():
    """The gloo process group background saves use, or None without an initialized process group.

    Made at world size 1 too: ``dcp.async_save`` refuses a default group without a CPU backend (a 1-rank NCCL
    world: "A CPU backend must be enabled for async save", torch 2.11 state_dict_saver.py:298, seen on one H200
    on 2026-12-01)."""
    if not _group:
        import torch.distributed as dist

        made = None
        if dist.is_available() and dist.is_initialized():
            made = dist.new_group(backend="gloo")
        _group.append(made)
    return _group[0]


def forget() -> None:
    """After this process's process group ended (save.forget): the next save makes a gloo group of its own."""
    _group.clear()


def gather(obj, group, rank: int, world: int) -> list:
    """Every rank's ``obj`` on rank 0 (in rank order); ``[]`` on the other ranks."""
    if group is None or world == 1:
        return [obj]
    import torch.distributed as dist

    out = [None] * world if rank == 0 else None
    dist.gather_object(obj, out, dst=0, group=group)
    return out or []


def broadcast(obj, group, rank: int, world: int):
    """Rank 0's ``obj`` on every rank."""
    if group is None or world == 1:
        return obj
    import torch.distributed as dist

    box = [obj if rank == 0 else None]
    dist.broadcast_object_list(box, src=0, group=group)
    return box[0]


def teardown(original, trainer) -> None:
    """Lightning's ``Trainer._teardown`` (the end of a fit, or an exception or preemption stopping it), after
    the save in flight is sealed. Raises SaveFailed when a background save failed and nothing else is being
    raised, or when a preemption is (its checkpoint would not be valid)."""
    from sprite.runtime.ckpt import durable

    durable.drain()
    original(trainer)
    raising = sys.exc_info()[1]
    if raising is None or isinstance(raising, SystemExit):
        durable.check()


def install() -> None:
    """Make every fit wait for its background saves as it ends (idempotent)."""
    from lightning.pytorch import Trainer

    from sprite.runtime import hooks

    hooks.wrap(Trainer, "_teardown", teardown)
