"""What one parity run is: model, precision, world, recipe constants and the arms it runs.

Light on purpose (no torch): the CLI, the criterion and the arm workers all read it.
"""

from __future__ import annotations

import dataclasses
import json

LORA_RANK = 8
LORA_ALPHA = 16
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")

PRESETS = {
    # Seconds on a laptop CPU.
    "tiny": dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=256, max_position_embeddings=128,
    ),
    # Qwen2.5-0.5B's published config with random seeded weights: 194 trainable, 290 frozen tensors.
    "qwen2.5-0.5b-shape": dict(
        hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
        num_key_value_heads=2, vocab_size=151936, max_position_embeddings=32768, rope_theta=1000000.0,
        rms_norm_eps=1e-6, tie_word_embeddings=True, use_sliding_window=False, hidden_act="silu",
    ),
}

PRECISIONS = ("32-true", "bf16-mixed")
FP32_ARMS = ("ref", "ddp", "fsdp")
BF16_ARMS = ("ref32", "ref", "split", "split_premul", "ddp", "fsdp")
SINGLE_ARMS = ("ref32", "ref", "split", "split_premul")
DISTRIBUTED_ARMS = ("ddp", "fsdp")


class JsonSettings:
    """A frozen settings dataclass as the JSON of a result folder (run.json, bench_settings.json), and back.

    ``from_dict`` leaves out keys the class does not know (a folder written by another version)."""

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict):
        known = {field.name for field in dataclasses.fields(cls)}
        return cls(**{key: value for key, value in data.items() if key in known})


@dataclasses.dataclass(frozen=True)
class Settings(JsonSettings):
    """One parity run. ``global_batch`` 0 means the default, two rows per rank."""

    precision: str = "32-true"
    devices: int = 2
    nodes: int = 1
    model: str = "tiny"
    accelerator: str = "auto"
    faults: tuple[str, ...] = ()
    seed: int = 0
    steps: int = 5
    lr: float = 1.0
    clip: float = 0.01
    seq_len: int = 16
    global_batch: int = 0
    time_limit: int = 1800  # seconds one arm's launch may run before the check ends as not executed

    def __post_init__(self):
        if not self.global_batch:
            object.__setattr__(self, "global_batch", 2 * self.world)
        object.__setattr__(self, "faults", tuple(self.faults))

    @property
    def world(self) -> int:
        return self.devices * self.nodes

    @property
    def arms(self) -> tuple[str, ...]:
        return BF16_ARMS if self.precision == "bf16-mixed" else FP32_ARMS


def arm_world(arm: str, settings: Settings) -> int:
    """Processes an arm runs on: the whole world for ddp/fsdp, one for the single-device arms."""
    return settings.world if arm in DISTRIBUTED_ARMS else 1


def shard_rows(step: int, rank: int, world: int, global_batch: int) -> list[int]:
    """Row indices rank ``rank`` trains at ``step`` under DistributedSampler(shuffle=False).

    The sampler gives rank r the rows r, r+world, r+2*world, ...; the loader cuts that list into batches of
    global_batch // world, so step s takes the s-th batch.
    """
    local = global_batch // world
    return [rank + world * (step * local + j) for j in range(local)]


def step_rows(step: int, global_batch: int) -> list[int]:
    """Row indices of the full global batch at ``step`` (what a single device trains)."""
    return list(range(step * global_batch, (step + 1) * global_batch))
