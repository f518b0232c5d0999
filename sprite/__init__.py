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

__all__ = ["__version__", "beat", *_RUNTIME_API]


def beat(step: int | None = None) -> None:
    """Tell sprite's stall watchdog that this rank finished training step ``step`` (None: one more step).

    The one line a Fabric or plain torch.distributed script adds to be watched as a Trainer is. Light: it imports
    nothing; outside a ``sprite run`` with a heartbeat (the runtime loaded no heartbeat module) it does nothing.
    """
    import sys

    beats = sys.modules.get("sprite.runtime.beats")
    if beats is not None:
        beats.beat(step)


def __getattr__(name: str):
    module = _RUNTIME_API.get(name)
    if module is None:
        raise AttributeError(f"module 'sprite' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
