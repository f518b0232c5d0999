"""What the fit-start checks read from the Trainer's data loaders and strategy (after Lightning set them up).

Lightning replaces a plain sampler by ``DistributedSampler`` and any other sampler by
``DistributedSamplerWrapper`` (a DistributedSampler over the sampler's indices; Lightning 2.6.6
trainer/connectors/data_connector.py:242-244); both pad to ``total_size`` unless ``drop_last``.
"""

from __future__ import annotations

import math
from typing import Optional

from torch.utils.data import DataLoader, DistributedSampler, IterableDataset

from sprite.runtime.checks.batch_math import BatchFacts, repeated_samples


def flatten(loaders) -> list[DataLoader]:
    """The DataLoaders in what ``trainer.val_dataloaders`` (etc.) returns: one, a list/tuple, a dict, or None."""
    if isinstance(loaders, DataLoader):
        return [loaders]
    if isinstance(loaders, dict):
        loaders = list(loaders.values())
    if isinstance(loaders, (list, tuple)):
        return [dl for item in loaders for dl in flatten(item)]
    return []


def distributed_sampler(loader: DataLoader) -> Optional[DistributedSampler]:
    """The DistributedSampler that picks this rank's indices, given directly or inside the batch sampler."""
    for sampler in (loader.sampler, getattr(loader.batch_sampler, "sampler", None)):
        if isinstance(sampler, DistributedSampler):
            return sampler
    return None


def repeated(loader: DataLoader) -> tuple[int, int]:
    """(samples in the whole set, samples the DistributedSampler repeats to even the ranks); (0, 0) without one."""
    sampler = distributed_sampler(loader)
    if sampler is None or sampler.drop_last:
        return 0, 0
    length = len(sampler.dataset)
    return length, repeated_samples(length, sampler.num_replicas)


def padded_sets(loaders, batches: list) -> list[tuple[int, int]]:
    """(length, repeated samples) of each evaluation loader whose DistributedSampler pads and whose loop runs
    to the end; ``batches`` says how many batches of each loader the loop runs (``trainer.num_val_batches``)."""
    out = []
    for loader, runs in zip(flatten(loaders), batches):
        length, extra = repeated(loader)
        if extra and runs >= len(loader):  # the repeated samples come last: a shortened loop never sees them
            out.append((length, extra))
    return out


def data_parallel(strategy, world: int, rank: int) -> tuple[int, int]:
    """(data-parallel size, this rank's data-parallel index): ranks of one tensor-parallel group share data."""
    mesh = getattr(strategy, "_device_mesh", None)  # ModelParallelStrategy (sprite's FSDP2Strategy) only
    if mesh is not None and "data_parallel" in (mesh.mesh_dim_names or ()):
        return mesh["data_parallel"].size(), mesh["data_parallel"].get_local_rank()
    return world, rank


def _samples(loader: DataLoader) -> Optional[int]:
    sampler = distributed_sampler(loader)
    if sampler is not None:
        return sampler.num_samples
    if isinstance(loader.dataset, IterableDataset):
        return None
    try:
        return len(loader.sampler)
    except TypeError:
        return None


def batch_facts(trainer, replicas: int) -> BatchFacts:
    """One rank's training batch as the Trainer will run it (a single training loader; else batch unknown)."""
    loaders = flatten(trainer.train_dataloader)
    accumulation = trainer.accumulate_grad_batches
    if len(loaders) != 1:
        return BatchFacts(None, replicas, accumulation)
    loader = loaders[0]
    local = loader.batch_size or getattr(loader.batch_sampler, "batch_size", None)
    drop_last = bool(loader.drop_last or getattr(loader.batch_sampler, "drop_last", False))
    batches = trainer.num_training_batches
    batches = None if batches is None or math.isinf(batches) else int(batches)
    samples = _samples(loader)
    try:
        full = len(loader)
    except TypeError:
        full = None
    if batches is not None and full is not None and batches < full:
        samples = None  # limit_train_batches: the loop never reaches the loader's short last batch
    return BatchFacts(local, replicas, accumulation, batches, samples, drop_last, repeated(loader)[1])
