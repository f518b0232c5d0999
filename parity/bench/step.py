"""The Lightning script `sprite bench` times: the sprite arm runs it under ``python -m sprite.runtime`` (sprite
fills the Trainer from the launched world), the lightning baseline runs the same file under ``torchrun``
without sprite (the Trainer arguments are then written out, as a plain Lightning user writes them).

    python -m sprite.runtime step.py --out DIR --world N --arm sprite --repeat R
    torchrun --nproc-per-node N step.py --out DIR --world N --arm lightning --repeat R
"""

from __future__ import annotations

import os
import sys

import lightning as L
from torch.distributed.fsdp import FSDPModule

from sprite.parity.bench import model as bench_model
from sprite.parity.bench.store import load_settings
from sprite.parity.bench.worker import Measure, parse
from sprite.parity.strategies import under_sprite_runtime
from sprite.errors import UsageError
from sprite.runtime.devices import device_type
from sprite.runtime.shard import shard_model


def trainer_kwargs(settings) -> dict:
    """Nothing under sprite (its runtime fills in the launched world); under torchrun, Lightning's own
    accelerator, devices, num_nodes, strategy and precision for the world torchrun started."""
    if under_sprite_runtime():
        return {}
    from lightning.pytorch.strategies import ModelParallelStrategy

    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    strategy = ("ddp" if settings.strategy == "ddp" else
                ModelParallelStrategy(data_parallel_size=world, tensor_parallel_size=1))
    # "auto" as sprite resolves it (xpu first): Lightning's own "auto" knows no XPU and would train on the CPU
    accelerator = device_type(settings.accelerator).name
    if accelerator == "xpu":
        raise UsageError("--baseline lightning cannot run on xpu (--accelerator auto found XPU devices).",
                         "Lightning has no XPU accelerator without sprite; its own auto would train on the CPU.",
                         "Drop --baseline lightning on XPU (--baseline raw still runs).")
    return {"accelerator": accelerator, "devices": local, "num_nodes": world // local,
            "strategy": strategy, "precision": settings.precision}


class BenchModule(L.LightningModule):
    """Trains bench_model's step; the hooks around each step hand over to the rank's Measure."""

    def __init__(self, args):
        super().__init__()
        self.args, self.settings = args, load_settings(args.out)
        self.net = bench_model.build(self.settings)
        self.measure: Measure | None = None

    def configure_model(self) -> None:
        # The same fully_shard units (decoder blocks, then the root) as the raw loop's; sprite would shard an
        # unsharded model the same way, but the lightning baseline has no sprite to do it.
        if self.settings.strategy == "fsdp" and not isinstance(self.net, FSDPModule):
            shard_model(self.net, self.device_mesh["data_parallel"])

    def on_fit_start(self) -> None:
        vocab = self.net.backbone.config.vocab_size
        self.measure = Measure(self.args, device_type(self.device.type), self.device, self.global_rank, vocab)

    def train_dataloader(self):
        return self.measure.loader

    def configure_optimizers(self):
        return bench_model.optimizer(self.net)

    def on_train_batch_start(self, batch, batch_idx) -> None:
        bench_model.set_grad_sync([self.trainer.strategy.model, self.net], self.measure.grad_sync(batch_idx))
        self.measure.before_step(batch_idx)

    def training_step(self, batch, batch_idx):
        ids, labels = batch
        return bench_model.loss(self.net, ids, labels)

    def on_train_batch_end(self, outputs, batch, batch_idx) -> None:
        self.measure.after_step(batch_idx, self.net)

    def on_train_end(self) -> None:
        self.measure.finish({"lightning": L.__version__, "under_sprite": under_sprite_runtime(),
                             "strategy_class": type(self.trainer.strategy).__name__,
                             "precision_class": type(self.trainer.precision_plugin).__name__})


def main(argv: list[str] | None = None) -> int:
    """Fits the planned steps on this rank. Raises IntegrityError if this rank's record already exists."""
    from sprite.runtime import finish

    finish.skip_teardown()  # sprite's own worker: nothing to finalize once its atexit handlers ran (finish.py)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    args = parse(argv, "sprite.parity.bench.step")
    module = BenchModule(args)
    steps = module.settings.step_plan(args.world, module.settings.probes(args.world, args.arm))
    trainer = L.Trainer(
        **trainer_kwargs(module.settings), max_steps=len(steps),
        max_epochs=1, use_distributed_sampler=False, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0,
    )
    trainer.fit(module)
    return 0


def cli_main() -> int:
    """:func:`main` as the lightning baseline's ranks run it (under torchrun, without sprite's runtime to report
    its errors): a SpriteError is one line on stderr and its exit code, not a traceback."""
    from sprite.errors import EXIT_USAGE, SpriteError, report

    try:
        return main()
    except SpriteError as err:
        print(report(err), file=sys.stderr, flush=True)
        return err.exit_code or EXIT_USAGE


if __name__ == "__main__":
    sys.exit(cli_main())
