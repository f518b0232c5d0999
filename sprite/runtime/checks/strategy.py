"""Refuse a Trainer strategy that is not one sprite launches, before any process group starts.

In a launched world of more than one rank: a DDP that starts its own processes (``ddp_spawn``, ``ddp_fork``,
``DDPStrategy(start_method="spawn")``) would start a second world inside each rank, so it is always refused.
Lightning's FSDP1 ``FSDPStrategy`` and ``DeepSpeedStrategy`` are refused unless the checks are off.
"""

from __future__ import annotations

from typing import Optional

from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy, FSDPStrategy, Strategy, StrategyRegistry

from sprite.errors import UsageError
from sprite.runtime.checks import findings
from sprite.runtime.config import RuntimeConfig

FOREIGN = (FSDPStrategy, DeepSpeedStrategy)


def built(value) -> tuple[Optional[type], Optional[str]]:
    """The strategy class Lightning builds for a ``Trainer(strategy=value)`` and its DDP start method, if any."""
    if isinstance(value, Strategy):
        return type(value), getattr(value, "_start_method", None)
    if isinstance(value, str) and value in StrategyRegistry:
        entry = StrategyRegistry[value]
        cls = entry["strategy"]
        method = entry["init_params"].get("start_method", "popen") if issubclass(cls, DDPStrategy) else None
        return cls, method
    return None, None


def _label(value, cls: type) -> str:
    return f"{cls.__name__} (strategy={value!r})" if isinstance(value, str) else cls.__name__


def _raise(finding: findings.Finding) -> None:
    raise UsageError(finding.what, finding.cause, finding.fix)


def check(cfg: RuntimeConfig, value, resolved: bool) -> None:
    """Refuse ``value`` (the script's strategy, or sprite's resolution of it when ``resolved``).

    Before resolution only instances count as foreign: the string "fsdp" becomes sprite's FSDP2 under
    ``--strategy fsdp`` and Lightning's FSDP1 otherwise, so strings are judged once resolved.

    Raises:
        UsageError: a spawning DDP, or (checks not off) Lightning's FSDPStrategy or DeepSpeedStrategy, in a
            launched world of more than one rank.
    """
    if cfg.world_size < 2:
        return
    cls, method = built(value)
    if cls is None:
        return
    if method not in (None, "popen"):
        _raise(findings.spawning_strategy(_label(value, cls), method, cfg.world_size))
    if cfg.checks != "off" and issubclass(cls, FOREIGN) and (resolved or isinstance(value, Strategy)):
        _raise(findings.foreign_strategy(_label(value, cls), cfg.world_size))
