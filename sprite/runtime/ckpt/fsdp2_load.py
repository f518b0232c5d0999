"""Resume a 1-device or DDP checkpoint file under FSDP2 when the optimizer holds only some parameters (LoRA).

Such a file keys AdamW's state by position in the optimizer's parameter list. Lightning 2.6.6 re-keys it to
names through *all* model parameters (fabric/strategies/model_parallel.py:598, ``FSDP.rekey_optim_state_dict``
called without the optimizer, from :482): with frozen parameters in the model, position 0 becomes the first
frozen tensor's name and torch refuses the load, "Missing optimizer state for parameter ..."
(torch/distributed/checkpoint/state_dict.py:1037; reproduced on CPU with the parity recipe, 2026-11-29). Here
positions are mapped through the optimizer's own parameter list instead; the rest of the load is Lightning's.
"""

from __future__ import annotations

import torch
from torch import nn

from sprite.errors import UsageError


def positional(checkpoint: dict) -> bool:
    """True when the checkpoint's optimizer states are keyed by position (saved on 1 device or by DDP)."""
    states = checkpoint.get("optimizer_states") or []
    return any(isinstance(key, int) for state in states for key in state.get("state", {}))


def by_name(state: dict, optimizer: torch.optim.Optimizer, module: nn.Module) -> dict:
    """``state`` re-keyed by parameter name, position i being the optimizer's i-th parameter (torch's own
    numbering in ``Optimizer.state_dict``). Raises UsageError when the parameter counts differ."""
    names = {id(param): name for name, param in module.named_parameters()}
    order = [names[id(param)] for group in optimizer.param_groups for param in group["params"]]
    saved = [position for group in state["param_groups"] for position in group["params"]]
    if len(saved) != len(order):
        raise UsageError(f"The checkpoint's optimizer holds {len(saved)} parameters, this one {len(order)}.",
                         "The model or its trainable parameters changed since the checkpoint was saved.",
                         "Resume with the model and optimizer the checkpoint was saved with.")
    rename = dict(zip(saved, order))
    return {"state": {rename[key]: value for key, value in state["state"].items()},
            "param_groups": [{**group, "params": [rename[p] for p in group["params"]]}
                             for group in state["param_groups"]]}


def restore(module: nn.Module, optimizers: list, checkpoint: dict, strict: bool) -> dict:
    """Loads a full-state ``checkpoint`` (as torch.load returned it) into the sharded ``module`` and its
    ``optimizers``; returns what is left for Lightning to restore (loops, LR schedulers, ...), as Lightning's own
    full-file branch does. Raises UsageError (see ``by_name``)."""
    from lightning.fabric.strategies.model_parallel import _load_raw_module_state
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    _load_raw_module_state(checkpoint.pop("state_dict"), module, strict=strict)
    options = StateDictOptions(broadcast_from_rank0=True, full_state_dict=True, strict=strict)
    for optimizer, state in zip(optimizers, checkpoint["optimizer_states"]):
        set_optimizer_state_dict(module, optimizer, optim_state_dict=by_name(state, optimizer, module), options=options)
    return checkpoint
