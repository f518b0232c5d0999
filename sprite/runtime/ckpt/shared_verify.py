"""Verify a checkpoint with every rank's help before resuming from it, or while loading it.

Rank 0 reads the manifest and checks that every listed file is there with its recorded size (metadata only),
then every rank hashes its share of the files and the first problem any rank found becomes every rank's answer.
A rank's share is the shard files it wrote (``__<rank>_*``: at the same world size, the ones it loads, so each
node reads what it will load and nothing else) and its turn of the rest. A sharded checkpoint of a large job
holds one or more files per rank that saved it; hashed by rank 0 alone, the whole checkpoint would be read
through one node before anyone may load.

:func:`start` can leave the shard files (``*.distcp``) to a background thread of each rank, so that the load
reads them while they are hashed (a cold load then reads them from disk once, not twice); everything else, the
``.metadata`` that torch unpickles first among them, is verified before :func:`start` returns. The shard files
hold only what sprite's reader reads with a tensor's few names allowed, or ``torch.load(weights_only=True)``.
Every rank must call :func:`start` and :meth:`Pending.verdict` (or :func:`verify`) for the same path, in the
same order.
"""

from __future__ import annotations

import concurrent.futures

from sprite import integrity
from sprite.runtime import allranks


def _share(names: list[str], rank: int, world: int) -> list[str]:
    from sprite.runtime.ckpt.seal import owner

    owners = {name: owner(name, world) for name in names}
    rest = sorted(name for name in names if owners[name] is None)
    return sorted([name for name in names if owners[name] == rank] + rest[rank::world])


def _agreed(reason: str, manifest) -> integrity.Verdict:
    problem = next((found for found in allranks.gather(reason) if found), "")
    return integrity.Verdict(not problem, problem, manifest)


class Pending:
    """A verification under way on this rank's background thread (or already decided)."""

    def __init__(self, manifest, decided: integrity.Verdict | None = None, job=None):
        self.manifest, self.decided, self.job = manifest, decided, job

    @property
    def later(self) -> bool:
        """Whether files are still being hashed in the background (the verdict is not known yet)."""
        return self.job is not None

    def verdict(self) -> integrity.Verdict:
        """The verdict, the same on every rank (every rank calls it)."""
        if self.job is None:
            return self.decided
        reason = self.job.result().reason
        self.job = None
        self.decided = _agreed(reason, self.manifest)
        return self.decided


def start(strategy, path, background: bool = False) -> Pending:
    """Check ``path`` (a sealed file or folder): the listing on rank 0, then each rank's share. With
    ``background``, a folder's shard files (``*.distcp``) are hashed on a thread of each rank while the caller
    goes on (loads them); every other file now. Never raises for a bad target."""
    world = getattr(strategy, "world_size", 1)  # a SingleDeviceStrategy has none
    rank = getattr(strategy, "global_rank", 0)
    head = strategy.broadcast(integrity.check_listing(path) if strategy.is_global_zero else None)
    if not head.valid:
        return Pending(head.manifest, head)
    share = _share(sorted(head.manifest["files"]), rank, world)
    later = [name for name in share if background and name.endswith(".distcp")]
    now = [name for name in share if name not in later]
    first = _agreed(integrity.check_digests(path, head.manifest, now).reason, head.manifest)
    if not first.valid or not background:  # the same on every rank, even one with no shard file in its share
        return Pending(head.manifest, first)
    pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="sprite-verify")
    job = pool.submit(integrity.check_digests, path, head.manifest, later)
    pool.shutdown(wait=False)
    return Pending(head.manifest, job=job)


def verify(strategy, path) -> integrity.Verdict:
    """The verdict on ``path`` (a sealed file or folder), the same on every rank. Never raises for a bad target."""
    return start(strategy, path).verdict()


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
