"""Refuse ``pytorch_lightning.Trainer`` in a launched multi-process world instead of training the wrong world.

``pytorch_lightning`` is a separate copy of Lightning with its own classes: sprite's accelerator, strategies and
cluster environments subclass ``lightning.pytorch`` classes, which its Trainer rejects. Left alone, its Trainer
would see LOCAL_RANK, take 1 device and train every rank as a world of one (or self-spawn workers under mpiexec).
Its Trainer is wrapped when (and only if) the script imports it (hooks.after_import), so sprite never imports it
itself.
"""

from __future__ import annotations

import functools
import sys

from sprite.errors import UsageError
from sprite.runtime import hooks

_MODULE = "pytorch_lightning.trainer.trainer"


def _refusing(original, cfg):
    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        raise UsageError(
            f"The script builds a pytorch_lightning.Trainer in a launched world of {cfg.world_size} processes.",
            "sprite fills in only lightning.pytorch.Trainer (package `lightning`); `pytorch_lightning` is a"
            " separate copy whose Trainer would train each rank alone.",
            "Import Lightning as `import lightning.pytorch as pl` (or `import lightning as L`) in the script.",
        )

    __init__._sprite_refusing = True
    return __init__


def install(cfg) -> None:
    """Refuse its Trainer in a launched world of more than one process (a world of one runs as is), once the script
    imports it (hooks.after_import)."""
    if cfg.world_size <= 1:
        return

    def refuse() -> None:
        trainer = sys.modules[_MODULE].Trainer
        if not getattr(trainer.__init__, "_sprite_refusing", False):
            trainer.__init__ = _refusing(trainer.__init__, cfg)

    hooks.after_import(_MODULE, refuse)
