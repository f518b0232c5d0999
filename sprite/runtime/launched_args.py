"""The launched world against a Lightning constructor's arguments, shared by ``Trainer`` and ``Fabric``.

Arguments that agree with the launch pass through; ones the script left open are filled in; a contradicting one
stops with one line naming both values, before any process group starts. ``owner`` ("Trainer" or "Fabric") only
names the constructor in messages; what differs between the two (strategy and precision classes) stays in
trainer_wrap.py and fabric_wrap.py.
"""

from __future__ import annotations

from lightning.fabric import strategies as fabric_strategies
from lightning.fabric.plugins.environments import ClusterEnvironment, LightningEnvironment
from lightning.pytorch import strategies as pl_strategies

from sprite.errors import UsageError
from sprite.runtime.config import RuntimeConfig
from sprite.runtime.ddp import XPUDDPStrategy
from sprite.runtime.devices import DeviceType, device_type
from sprite.runtime.environment import ENVIRONMENTS
from sprite.runtime.kwargs import accelerator_for
from sprite.runtime.precision import normalize_precision

_FAMILIES = (
    ((pl_strategies.DDPStrategy, fabric_strategies.DDPStrategy), "ddp"),
    ((pl_strategies.ModelParallelStrategy, fabric_strategies.ModelParallelStrategy), "fsdp"),
    ((pl_strategies.SingleDeviceStrategy, fabric_strategies.SingleDeviceStrategy), "single"),
)
_STRATEGY_BASES = (pl_strategies.Strategy, fabric_strategies.Strategy)


def as_list(given) -> list:
    """An argument that takes one item or a list (plugins, callbacks) as a new list."""
    return list(given) if isinstance(given, (list, tuple)) else ([] if given is None else [given])


def conflict(owner: str, arg: str, given, launched: str) -> UsageError:
    return UsageError(
        f"{owner}({arg}={given!r}) contradicts the launch, which has {launched}.",
        "The script hard-codes a value for another world than the one sprite launched.",
        f"Remove {arg}= from the {owner} (sprite fills it in) or launch with a matching value.",
    )


def num_nodes(owner: str, cfg: RuntimeConfig, given) -> int:
    if given is not None and int(given) != cfg.num_nodes:
        raise conflict(owner, "num_nodes", given, f"{cfg.num_nodes} node(s)")
    return cfg.num_nodes


def accelerator(owner: str, launched: str, given) -> tuple[object, DeviceType]:
    """The accelerator value and its table row; the script's own choice stands when the launch said "auto"."""
    if given in (None, "auto"):
        kind = device_type(launched)
        return accelerator_for(kind), kind
    name = given if isinstance(given, str) else getattr(given, "name", lambda: type(given).__name__)()
    try:
        kind = device_type(name)
    except UsageError:
        kind = None
    if launched != "auto" and (kind is None or kind.name != device_type(launched).name):
        raise conflict(owner, "accelerator", given, f"accelerator {launched!r}")
    return given, kind or device_type(launched)


def devices(owner: str, cfg: RuntimeConfig, given):
    if given in (None, "auto", -1, "-1"):
        return cfg.devices
    if isinstance(given, (list, tuple)):
        count = len(given)
    else:
        count = len(str(given).split(",")) if "," in str(given) else int(given)
    if count != cfg.devices:
        raise conflict(owner, "devices", given, f"{cfg.devices} rank(s) per node")
    return given


def family(given) -> str:
    """"auto", "ddp", "fsdp", "single", or the strategy's own name for anything else (Trainer or Fabric)."""
    if given in (None, "auto"):
        return "auto"
    if isinstance(given, _STRATEGY_BASES):
        return next((name for classes, name in _FAMILIES if isinstance(given, classes)), type(given).__name__)
    if given.startswith("ddp") or given == XPUDDPStrategy.strategy_name:
        return "ddp"
    return {"fsdp2": "fsdp", "single_device": "single"}.get(given, given)


def strategy_family(owner: str, cfg: RuntimeConfig, given) -> str:
    """The strategy family to run: the launch's, else the script's, else "ddp" for several ranks; "" to keep
    the script's value (or Lightning's "auto" for one rank) as it is.

    Raises:
        UsageError: the script's strategy is of another family than the launched one.
    """
    given_family, wanted = family(given), cfg.strategy
    if wanted == "auto":
        if given_family != "auto" or cfg.world_size == 1:
            return ""
        return "ddp"
    if given_family not in ("auto", wanted):
        raise conflict(owner, "strategy", given, f"strategy {wanted!r}")
    return wanted


def precision_target(owner: str, cfg: RuntimeConfig, given):
    """The precision to run: the launch's when it named one (the script's must agree), else the script's."""
    if cfg.precision == "auto":
        return given
    if given is not None and normalize_precision(given) != normalize_precision(cfg.precision):
        raise conflict(owner, "precision", given, f"precision {cfg.precision!r}")
    return cfg.precision


def add_environment(cfg: RuntimeConfig, plugins: list) -> None:
    """Append the launcher's cluster environment (validated against the launch) unless the script gave one.

    A world of one rank gets Lightning's own ``LightningEnvironment``, the one Lightning falls back to: left to
    choose, Lightning first tries its other environments in turn, and ``MPIEnvironment.detect`` imports
    ``mpi4py.MPI`` wherever mpi4py is installed, which starts MPI in the rank. On one H200 Open MPI's start-up then
    took the preemption signal away from the rank (docs/runs/h200-2026-12-03-c).
    """
    if not cfg.launcher or any(isinstance(p, ClusterEnvironment) for p in plugins):
        return
    if cfg.world_size == 1:
        plugins.append(LightningEnvironment())
        return
    environment = ENVIRONMENTS[cfg.launcher]()
    environment.validate_settings(cfg.devices, cfg.num_nodes)
    plugins.append(environment)
