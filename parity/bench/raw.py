"""The raw baseline: the same step as step.py in a plain PyTorch loop (no Lightning, no sprite runtime),
started by ``torchrun``. Only the measuring instrument (Measure, the device table's synchronize) is shared.

    torchrun --nproc-per-node N raw.py --out DIR --world N --arm raw --repeat R
"""

from __future__ import annotations

import contextlib
import os
import sys

import torch
import torch.distributed as dist

from sprite.parity.bench import model as bench_model
from sprite.parity.bench.store import load_settings
from sprite.parity.bench.worker import Measure, parse
from sprite.runtime.devices import device_type
from sprite.runtime.shard import shard_model


def _wrap(net: torch.nn.Module, strategy: str, kind, device: torch.device, world: int) -> torch.nn.Module:
    """DDP as Lightning's DDPStrategy builds it (device_ids off CPU), or fully_shard per block, then the root."""
    if strategy == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh

        return shard_model(net, init_device_mesh(kind.name, (world,)))
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(net, device_ids=None if device.type == "cpu" else [device.index])


def _autocast(settings, kind):
    if settings.precision == "bf16-mixed":  # as Lightning's MixedPrecision: forward and loss, not backward
        return torch.autocast(kind.autocast, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def main(argv: list[str] | None = None) -> int:
    """Runs the planned steps on this rank and writes its record. Raises IntegrityError if it exists."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    args = parse(argv, "sprite.parity.bench.raw")
    settings = load_settings(args.out)
    rank, local = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    kind = device_type(settings.accelerator)
    device = torch.device("cpu") if kind.name == "cpu" else torch.device(kind.name, local)
    if kind.name != "cpu":
        kind.module().set_device(device)
    dist.init_process_group(backend=kind.backend)
    net = bench_model.build(settings).to(device)
    model = _wrap(net, settings.strategy, kind, device, args.world)
    optimizer = bench_model.optimizer(net)
    measure = Measure(args, kind, device, rank, net.backbone.config.vocab_size)
    for index, (ids, labels) in enumerate(measure.loader):
        bench_model.set_grad_sync([model], measure.grad_sync(index))
        measure.before_step(index)
        ids, labels = ids.to(device, non_blocking=True), labels.to(device, non_blocking=True)
        with _autocast(settings, kind):
            loss = bench_model.loss(model, ids, labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        measure.after_step(index, net)
    measure.finish({"lightning": None, "under_sprite": False, "strategy_class": type(model).__name__,
                    "precision_class": settings.precision})
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
