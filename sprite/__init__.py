"""sprite: launch PyTorch Lightning scripts on supercomputers and prove the distributed run is right.

``import sprite`` stays light (the CLI imports it on login nodes); the runtime API below is loaded on first
use, so ``from sprite import trainer_kwargs`` imports torch and lightning only then.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_RUNTIME_API = {
    "trainer_kwargs": "sprite.runtime.kwargs",
    "shard_model": "sprite.runtime.shard",
    "XPUAccelerator": "sprite.runtime.accelerator",
    "XPUMixedPrecision": "sprite.runtime.precision",
    "XPUDDPStrategy": "sprite.runtime.ddp",
    "FSDP2Strategy": "sprite.runtime.fsdp2",
    "PALSEnvironment": "sprite.runtime.environment",
}

__all__ = ["__version__", *_RUNTIME_API]


def __getattr__(name: str):
    module = _RUNTIME_API.get(name)
    if module is None:
        raise AttributeError(f"module 'sprite' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
