"""The parity recipe: a Qwen2 decoder with a peft LoRA adapter and a 2-class head on the last token.

Every arm builds the model and the rows through this module, in the same order and from the same seeds, so
all arms start from bit-identical trainable tensors and train on identical rows. Imports torch, transformers
and peft: only arm workers import it.
"""

from __future__ import annotations

import contextlib
import os

import torch
from torch import nn
from torch.utils.data import Dataset

from sprite.errors import UsageError
from sprite.parity.settings import LORA_ALPHA, LORA_RANK, LORA_TARGETS, PRESETS, Settings


class Classifier(nn.Module):
    """A decoder backbone (LoRA-wrapped) and a linear head over the last token's hidden state."""

    def __init__(self, backbone: nn.Module, hidden: int):
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(hidden, 2, bias=True)
        # A negative control (fp32-backbone) swaps this for a context that disables autocast.
        self.backbone_context = contextlib.nullcontext

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        with self.backbone_context():
            hidden = self.backbone(input_ids=input_ids).last_hidden_state
        return self.head(hidden[:, -1, :])


class Rows(Dataset):
    """The run's rows as (row index, token ids, label)."""

    def __init__(self, ids: torch.Tensor, labels: torch.Tensor):
        self.ids, self.labels = ids, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int):
        return index, self.ids[index], self.labels[index]


def backbone(model: str, attention: str | None = None) -> nn.Module:
    """Builds the decoder for a preset name or a local checkpoint directory, with Hugging Face attention
    ``attention``; None means parity's choice: "eager" for presets, the checkpoint's own for a directory.

    Raises UsageError when ``model`` is neither a preset nor a directory holding a Hugging Face config.
    """
    from transformers import Qwen2Config, Qwen2Model

    if model in PRESETS:
        config = Qwen2Config(**PRESETS[model], attn_implementation=attention or "eager")
        return Qwen2Model(config)
    if os.path.isfile(os.path.join(model, "config.json")):
        from transformers import AutoModel

        chosen = {"attn_implementation": attention} if attention else {}
        return AutoModel.from_pretrained(model, local_files_only=True, torch_dtype=torch.float32, **chosen)
    raise UsageError(
        f"--model {model!r} is neither a preset ({', '.join(PRESETS)}) nor a checkpoint directory.",
        "A hub id was given, or the path has no config.json.",
        "Pass a preset name or a local directory saved with save_pretrained (the hub is never contacted).",
    )


def add_lora(decoder: nn.Module) -> nn.Module:
    """Freezes ``decoder`` and wraps it in the recipe's peft LoRA (r=8, alpha=16 on q/k/v/o), lora_B ~ N(0, 0.01)
    drawn from seed 1."""
    from peft import LoraConfig, get_peft_model

    for param in decoder.parameters():
        param.requires_grad_(False)
    lora = LoraConfig(r=LORA_RANK, lora_alpha=LORA_ALPHA, target_modules=list(LORA_TARGETS), lora_dropout=0.0)
    decoder = get_peft_model(decoder, lora)
    draw = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, param in decoder.named_parameters():
            if "lora_B" in name:
                # peft starts lora_B at zero, which makes every step-0 lora_A gradient exactly zero.
                param.copy_(torch.randn(param.shape, generator=draw) * 0.01)
    return decoder


def build_model(settings: Settings) -> Classifier:
    """Builds the seeded model: frozen backbone, LoRA on q/k/v/o, lora_B ~ N(0, 0.01) from seed 1, a head.

    Raises UsageError for an unknown model (see ``backbone``).
    """
    torch.manual_seed(settings.seed)
    decoder = add_lora(backbone(settings.model))
    torch.manual_seed(settings.seed + 2)
    model = Classifier(decoder, decoder.config.hidden_size)
    return model.float()


def make_rows(settings: Settings, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """All rows of the run: token ids (rows x seq_len) and int64 labels in {0, 1}, drawn from the seed."""
    draw = torch.Generator().manual_seed(settings.seed)
    total = settings.steps * settings.global_batch
    ids = torch.randint(0, vocab, (total, settings.seq_len), generator=draw)
    labels = torch.randint(0, 2, (total,), generator=draw, dtype=torch.int64)
    return ids, labels


def trainable_names(model: nn.Module) -> list[str]:
    """Names of the trainable tensors, in registration order (the order every record uses)."""
    return [name for name, param in model.named_parameters() if param.requires_grad]


def frozen_names(model: nn.Module) -> list[str]:
    """Names of the frozen tensors, in registration order."""
    return [name for name, param in model.named_parameters() if not param.requires_grad]


def row_loss(model: nn.Module, ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy averaged over the rows given (autocast, if any, comes from the caller)."""
    return nn.functional.cross_entropy(model(ids), labels)


def pick_device(accelerator: str) -> torch.device:
    """The device a single-device arm uses, from sprite's device table (the row the ddp/fsdp arms' runtime
    uses too): the requested type, or for "auto" the first available of xpu, cuda, cpu.

    Raises UsageError when the requested accelerator is unknown or not available in this process.
    """
    from sprite.runtime.devices import device_type

    kind = device_type(accelerator)
    if not kind.is_available():
        raise UsageError(
            f"--accelerator {accelerator} was requested but torch sees no {accelerator} device.",
            "The job runs on a node without that device, or torch was built without its support.",
            "Run on a node with the device, or pass --accelerator cpu.",
        )
    return torch.device(kind.name)
