"""Verify a checkpoint with every rank's help before resuming from it.

Rank 0 reads the manifest and checks that every listed file is there with its recorded size (metadata only),
then every rank hashes its share of the files (``sorted(names)[rank::world]``) and the first problem any rank
found becomes every rank's answer. A sharded checkpoint of a large job holds one or more files per rank that
saved it; hashed by rank 0 alone, the whole checkpoint would be read through one node before anyone may load.
Every rank must call :func:`verify` for the same path, in the same order.
"""

from __future__ import annotations

from sprite import integrity
from sprite.runtime import collective


def verify(strategy, path) -> integrity.Verdict:
    """The verdict on ``path`` (a sealed file or folder), the same on every rank. Never raises for a bad target."""
    world = getattr(strategy, "world_size", 1)  # a SingleDeviceStrategy has none
    if world == 1:
        return integrity.verify(path)
    head = strategy.broadcast(integrity.check_listing(path) if strategy.is_global_zero else None)
    if not head.valid:
        return head
    share = sorted(head.manifest["files"])[strategy.global_rank::world]
    reasons = collective.gather(integrity.check_digests(path, head.manifest, share).reason)
    problem = next((reason for reason in reasons if reason), "")
    return integrity.Verdict(not problem, problem, head.manifest)


class DefaultGroup:
    """What :func:`verify` asks of a Lightning strategy, for code with a plain torch.distributed process group
    (benchmarks, tests): rank, world size and a broadcast from rank 0 over the default group."""

    def __init__(self) -> None:
        import torch.distributed as dist

        self.global_rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.is_global_zero = self.global_rank == 0

    def broadcast(self, obj):
        import torch.distributed as dist

        box = [obj]
        dist.broadcast_object_list(box, 0)
        return box[0]
