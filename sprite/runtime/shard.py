"""``shard_model``: FSDP2 (``fully_shard``) over a model's repeated blocks, bottom-up, then the root."""

from __future__ import annotations

from typing import Iterable, Optional

from torch import nn
from torch.distributed.fsdp import FSDPModule, fully_shard

from sprite.errors import UsageError


def block_classes(module: nn.Module) -> set[str]:
    """Class names listed in Hugging Face ``_no_split_modules`` anywhere inside ``module`` (peft wrappers too)."""
    names: set[str] = set()
    for sub in module.modules():
        names.update(getattr(sub, "_no_split_modules", None) or ())
    return names


def shard_model(module: nn.Module, mesh, layer_classes: Optional[Iterable[type]] = None) -> nn.Module:
    """Apply ``fully_shard`` to every block of ``layer_classes`` (default: HF ``_no_split_modules``), then the root.

    Blocks are sharded deepest first so each block owns its own parameters and the root owns the rest.
    Idempotent: a module that is already sharded is left alone, as Lightning requires of configure_model.

    Raises:
        UsageError: no block class is given and none is listed in ``_no_split_modules``, or no module of the
            given classes exists in ``module``.
    """
    if isinstance(module, FSDPModule):
        return module
    wanted = tuple(layer_classes) if layer_classes is not None else None
    names = block_classes(module) if wanted is None else set()
    if wanted is None and not names:
        raise UsageError(
            f"shard_model found no block class in {type(module).__name__}.",
            "It has no Hugging Face `_no_split_modules` list to say which modules are the repeated blocks.",
            "Pass layer_classes=(YourBlock,), e.g. shard_model(model, mesh, layer_classes=(nn.TransformerEncoderLayer,)).",
        )
    blocks = [
        sub
        for sub in module.modules()
        if sub is not module and (isinstance(sub, wanted) if wanted else type(sub).__name__ in names)
    ]
    if not blocks:
        found = ", ".join(c.__name__ for c in wanted) if wanted else ", ".join(sorted(names))
        raise UsageError(
            f"shard_model found no module of class {found} inside {type(module).__name__}.",
            "The block classes do not occur in this model.",
            "Pass layer_classes= with classes that occur in the model.",
        )
    for block in reversed(blocks):  # modules() is pre-order: reversed means children before parents
        if not isinstance(block, FSDPModule):
            fully_shard(block, mesh=mesh)
    fully_shard(module, mesh=mesh)
    return module
