"""The world, said once at the start of a fit: what was launched and how many samples one optimizer step sees.

    sprite: world      1 node x 2 ranks per node = 2 ranks (launcher local)
    sprite: device     cpu, backend gloo
    sprite: strategy   XPUDDPStrategy, precision 32-true
    sprite: batch      8 per rank x 2 ranks x 2 accumulated = 32 samples per optimizer step
    sprite: epoch      3 batch(es) per rank per epoch; its last step sees 4 samples, not 32 (...)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch.distributed as dist

from sprite.runtime.checks.batch_math import BatchFacts, batch_lines
from sprite.runtime.config import RuntimeConfig
from sprite.runtime.checks.loaders import batch_facts, data_parallel

PREFIX = "sprite: "


@dataclass(frozen=True)
class WorldFacts:
    nodes: int
    per_node: int
    launcher: Optional[str]
    device: str
    backend: str
    strategy: str
    precision: str
    batch: BatchFacts


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def render(facts: WorldFacts) -> list[str]:
    """The block's lines, each prefixed ``sprite: ``."""
    world = facts.nodes * facts.per_node
    lines = [
        f"world      {_count(facts.nodes, 'node')} x {_count(facts.per_node, 'rank')} per node = "
        f"{_count(world, 'rank')} (launcher {facts.launcher or 'none'})",
        f"device     {facts.device}, backend {facts.backend}",
        f"strategy   {facts.strategy}, precision {facts.precision}",
        *batch_lines(facts.batch, world),
    ]
    return [PREFIX + line for line in lines]


def from_trainer(trainer, cfg: RuntimeConfig) -> WorldFacts:
    """The facts of a Trainer whose fit has set up its strategy and training loader (``on_train_start``)."""
    strategy = trainer.strategy
    replicas, _ = data_parallel(strategy, trainer.world_size, trainer.global_rank)
    backend = dist.get_backend() if dist.is_available() and dist.is_initialized() else "none (one process)"
    return WorldFacts(
        nodes=cfg.num_nodes,
        per_node=cfg.devices,
        launcher=cfg.launcher,
        device=strategy.root_device.type,
        backend=str(backend),
        strategy=type(strategy).__name__,
        precision=str(trainer.precision),
        batch=batch_facts(trainer, replicas),
    )
