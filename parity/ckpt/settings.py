"""What one checkpoint check is: model, precision, world, the recipe's constants, and the three injected faults.

Light on purpose (no torch): the CLI, the criterion and the rank workers all read it. The model is the parity
recipe's (LoRA sequence classification, 2-class head on the last token); training is AdamW with a per-step LR
schedule and global-norm clipping, ``epochs`` epochs of ``steps_per_epoch`` steps.
"""

from __future__ import annotations

import dataclasses

from sprite.parity.settings import JsonSettings

ARMS = ("single", "ddp", "fsdp", "fsdp_file")
FSDP_ARMS = ("fsdp", "fsdp_file")  # one FSDP2 training, two checkpoint formats
EXPORTED = ("ddp", "fsdp_file", "fsdp")  # checkpoints loaded on one device (fsdp after `sprite ckpt consolidate`)
DEFAULT_TIME_LIMIT_S = 1800
DEFAULT_SLOTS = 2  # one distributed launch, or two one-process launches, at a time

# fault -> (check families only it can fail, what it does after the restore)
FAULTS = {
    "dropped-optimizer-state": ({"optimizer"}, "AdamW's state is emptied"),
    "reset-lr-scheduler": ({"scheduler", "param_groups", "lr"}, "the LR scheduler restarts from step 0"),
    "perturbed-weight": ({"trainables", "loss"}, "the head weight's first element gets +1e-3"),
}


def lr_factor(step: int) -> float:
    """The per-step LR schedule (LambdaLR): every step's LR differs, so a scheduler reset shows at once."""
    return 1.0 / (1.0 + step)


@dataclasses.dataclass(frozen=True)
class CkptSettings(JsonSettings):
    """One checkpoint check. ``global_batch`` 0 means two rows per rank (the reshard then trains four)."""

    precision: str = "32-true"
    devices: int = 2
    nodes: int = 1
    model: str = "tiny"
    accelerator: str = "auto"
    seed: int = 0
    epochs: int = 2
    steps_per_epoch: int = 3
    lr: float = 1e-2
    clip: float = 0.05
    seq_len: int = 16
    global_batch: int = 0
    time_limit: int = DEFAULT_TIME_LIMIT_S
    slots: int = DEFAULT_SLOTS

    def __post_init__(self):
        if not self.global_batch:
            object.__setattr__(self, "global_batch", 2 * self.world)

    @property
    def world(self) -> int:
        return self.devices * self.nodes

    @property
    def steps(self) -> int:
        return self.epochs * self.steps_per_epoch

    @property
    def rows(self) -> int:
        """Rows in the data set: one epoch's worth (each epoch reshuffles them)."""
        return self.steps_per_epoch * self.global_batch

    def half_world(self) -> tuple[int, int]:
        """(devices, nodes) of the reshard: half the nodes when their count is even, else half the devices."""
        if self.nodes % 2 == 0:
            return self.devices, self.nodes // 2
        return self.devices // 2, self.nodes
