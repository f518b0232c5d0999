"""The three negative controls, injected right after the restore (what each does is listed in ckpt_settings).

Each breaks one part of the restored state, so the check that must reject it is known in advance: dropped AdamW
state fails the optimizer-state comparison, a restarted LR scheduler the scheduler, param-group and per-step LR
comparisons, a perturbed weight the trainable-tensor comparison and the first resumed loss. Only rank workers
import this module.
"""

from __future__ import annotations

import torch

from sprite.parity.ckpt.settings import FAULTS, lr_factor
from sprite.parity.ckpt.state import local


@torch.no_grad()
def inject(fault: str | None, net: torch.nn.Module, optimizer, scheduler, rank: int) -> None:
    """Applies ``fault`` (None: nothing) to the restored state of this rank.

    Raises ValueError for an unknown fault.
    """
    if fault is None:
        return
    if fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}")
    if fault == "dropped-optimizer-state":
        optimizer.state.clear()
    elif fault == "reset-lr-scheduler":
        for group, base in zip(optimizer.param_groups, scheduler.base_lrs):
            group["lr"] = base * lr_factor(0)
        scheduler.last_epoch, scheduler._step_count = 0, 1  # as LambdaLR.__init__ leaves them
        scheduler._last_lr = [group["lr"] for group in optimizer.param_groups]
    else:
        named = [(name, p) for name, p in net.named_parameters() if p.requires_grad]
        param = next((p for name, p in named if name.endswith("head.weight")), named[0][1])
        sharded = hasattr(param, "to_local")
        value = local(param)
        # Replicas (1 device, DDP) all change; of a sharded tensor only the shard holding element 0 does.
        if value.numel() and (not sharded or rank == 0):
            value.view(-1)[0] += 1e-3
