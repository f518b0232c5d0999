"""The step every arm of `sprite bench` trains: the parity recipe's Qwen2 classifier (LoRA or full), AdamW, and
random token rows served by a DataLoader whose batch size follows the arm's step plan.

Every arm (sprite, raw, lightning) builds it through this module, so they differ only in what runs it.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from sprite.parity import recipe
from sprite.parity.bench.settings import BenchSettings


def build(settings: BenchSettings) -> recipe.Classifier:
    """The seeded classifier: backbone with LoRA on q/k/v/o (only the adapters and the head train) or, for
    ``--full``, every weight trained. Raises UsageError for an unknown model."""
    torch.manual_seed(settings.seed)
    decoder = recipe.backbone(settings.model, settings.attention)
    if settings.lora:
        decoder = recipe.add_lora(decoder)
    model = recipe.Classifier(decoder, decoder.config.hidden_size).float()
    if settings.precision == "bf16-true":
        model = model.to(torch.bfloat16)
    return model


def blocks(model: nn.Module) -> list[nn.Module]:
    """The repeated decoder blocks (Hugging Face ``_no_split_modules``): the units compiled and sharded."""
    from sprite.runtime.shard import block_classes

    names = block_classes(model)
    return [sub for sub in model.modules() if type(sub).__name__ in names]


def compile_blocks(model: nn.Module) -> None:
    """torch.compile each decoder block in place (``nn.Module.compile``), as torchtitan compiles per block."""
    for block in blocks(model):
        block.compile()


def optimizer(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)


def loss(model: nn.Module, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(model(ids), labels)


def set_grad_sync(modules, enabled: bool) -> None:
    """Turns gradient synchronisation on or off for the next forward/backward: DDP's own no_sync flag
    (``require_backward_grad_sync``, what ``DDP.no_sync()`` toggles) or FSDP2's ``set_requires_gradient_sync``."""
    from torch.distributed.fsdp import FSDPModule
    from torch.nn.parallel import DistributedDataParallel

    for module in modules:
        if isinstance(module, DistributedDataParallel):
            module.require_backward_grad_sync = enabled
        elif isinstance(module, FSDPModule):
            module.set_requires_gradient_sync(enabled)


class Rows(Dataset):
    """A pool of random rows (token ids and a 2-class label) drawn from ``seed``."""

    def __init__(self, settings: BenchSettings, vocab: int, rows: int, seed: int):
        draw = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, vocab, (rows, settings.seq), generator=draw)
        self.labels = torch.randint(0, 2, (rows,), generator=draw)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int):
        return self.ids[index], self.labels[index]


def loader(settings: BenchSettings, plan: list[tuple[str, int]], vocab: int, rank: int) -> DataLoader:
    """One batch per planned step, of the planned size, rows taken in turn from a pool of this rank's own (every
    rank draws from another seed, so no two ranks train the same rows)."""
    biggest = max(batch for _, batch in plan)
    rows = Rows(settings, vocab, 2 * biggest, settings.seed + rank)
    batches, start = [], 0
    for _, batch in plan:
        batches.append([(start + i) % len(rows) for i in range(batch)])
        start = (start + batch) % len(rows)
    return DataLoader(rows, batch_sampler=batches)
