"""The fit-start contract checks: a Lightning callback the runtime adds to every Trainer of a launched script.

At ``on_train_start`` (loaders and strategy are set up) rank 0 prints the world block, and every rank looks
for ``NCCL_TIMEOUT`` and for evaluation sets DistributedSampler pads. At the first training batch the ranks
compare batch digests in one all-gather, the checks' only collective. ``validate``/``test`` runs check their
own sets. Warnings are one line each on rank 0; under ``--strict`` every rank raises the first one.
"""

from __future__ import annotations

import os
import sys

from lightning.pytorch.callbacks import Callback

from sprite.runtime.checks import batch_digest
from sprite.runtime.checks import findings
from sprite.runtime.checks import world_block
from sprite.runtime.config import RuntimeConfig
from sprite.runtime.checks.loaders import data_parallel, padded_sets


class FitChecks(Callback):
    """Says the launched world once per fit and warns where the distributed run computes something else."""

    def __init__(self, cfg: RuntimeConfig) -> None:
        self.cfg = cfg
        self._compare_first_batch = False
        self._said: set[str] = set()

    def _report(self, trainer, finding: findings.Finding) -> None:
        if finding.line() not in self._said:
            self._said.add(finding.line())
            findings.report(finding, self.cfg.checks, trainer.is_global_zero)

    def _environment(self, trainer) -> None:
        value = os.environ.get("NCCL_TIMEOUT", "")
        if value:
            self._report(trainer, findings.nccl_timeout(value, trainer.strategy.root_device.type))

    def _evaluation(self, trainer, stage: str, loaders, batches: list) -> None:
        for length, extra in padded_sets(loaders, batches):
            self._report(trainer, findings.padded_evaluation(stage, length, trainer.world_size, extra))

    def on_train_start(self, trainer, pl_module) -> None:
        if trainer.is_global_zero:
            print("\n".join(world_block.render(world_block.from_trainer(trainer, self.cfg))), file=sys.stderr,
                  flush=True)
        self._environment(trainer)
        self._evaluation(trainer, "validation", trainer.val_dataloaders, trainer.num_val_batches)
        self._compare_first_batch = trainer.world_size > 1

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        if not self._compare_first_batch:
            return
        self._compare_first_batch = False
        _, dp_rank = data_parallel(trainer.strategy, trainer.world_size, trainer.global_rank)
        rows = batch_digest.gather([batch_digest.digest(batch), dp_rank], trainer.strategy.root_device)
        groups = batch_digest.shared_groups([r[0] for r in rows], [r[1] for r in rows])
        if groups:
            self._report(trainer, findings.shared_batches(groups, trainer.world_size))

    def on_validation_start(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking:  # a fit's sets are checked at on_train_start, after its sanity check
            self._environment(trainer)
            self._evaluation(trainer, "validation", trainer.val_dataloaders, trainer.num_val_batches)

    def on_test_start(self, trainer, pl_module) -> None:
        self._environment(trainer)
        self._evaluation(trainer, "test", trainer.test_dataloaders, trainer.num_test_batches)
