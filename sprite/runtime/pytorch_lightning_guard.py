"""Refuse ``pytorch_lightning.Trainer`` in a launched multi-process world instead of training the wrong world.

``pytorch_lightning`` is a separate copy of Lightning with its own classes: sprite's accelerator, strategies and
cluster environments subclass ``lightning.pytorch`` classes, which its Trainer rejects. Left alone, its Trainer
would see LOCAL_RANK, take 1 device and train every rank as a world of one (or self-spawn workers under mpiexec).
A meta-path hook wraps its Trainer when (and only if) the script imports it, so sprite never imports it itself.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import sys

from sprite.errors import UsageError

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

    return __init__


class _Hook(importlib.abc.MetaPathFinder):
    def __init__(self, cfg):
        self.cfg = cfg

    def find_spec(self, name, path, target=None):
        if name != _MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module, cfg = spec.loader.exec_module, self.cfg

        def patched(module):
            exec_module(module)
            module.Trainer.__init__ = _refusing(module.Trainer.__init__, cfg)

        spec.loader.exec_module = patched
        return spec


def install(cfg) -> None:
    """Install the hook for a launched world of more than one process (a world of one runs as is)."""
    if cfg.world_size > 1 and not any(isinstance(f, _Hook) for f in sys.meta_path):
        sys.meta_path.insert(0, _Hook(cfg))
