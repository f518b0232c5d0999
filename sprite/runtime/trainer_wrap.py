"""Make a plain ``Trainer(...)`` run the launched world: fill what the script left open, refuse contradictions.

``PL_TRAINER_*`` environment defaults cannot carry plugins (Lightning 2.6.6 utilities/argparse.py,
_defaults_from_env_vars), so sprite wraps ``lightning.pytorch.Trainer.__init__`` instead. Every check here runs
inside that call, before Lightning creates a process group; the fit-start checks go in as a callback (fit_checks).
"""

from __future__ import annotations

import functools

from lightning.fabric.plugins.environments import ClusterEnvironment
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.strategies import DDPStrategy, ModelParallelStrategy, SingleDeviceStrategy, Strategy

from sprite.errors import UsageError
from sprite.runtime.checks import strategy as strategy_check
from sprite.runtime.config import RuntimeConfig
from sprite.runtime.ddp import XPUDDPStrategy
from sprite.runtime.devices import DeviceType, device_type
from sprite.runtime.environment import ENVIRONMENTS
from sprite.runtime.checks.fit import FitChecks
from sprite.runtime.kwargs import accelerator_for, make_strategy
from sprite.runtime.precision import MIXED, XPUMixedPrecision, normalize_precision
from sprite.runtime import beats as progress


def _as_list(given) -> list:
    """A Trainer argument that takes one item or a list (plugins, callbacks) as a new list."""
    return list(given) if isinstance(given, (list, tuple)) else ([] if given is None else [given])


def _conflict(arg: str, given, launched: str) -> UsageError:
    return UsageError(
        f"Trainer({arg}={given!r}) contradicts the launch, which has {launched}.",
        "The script hard-codes a value for another world than the one sprite launched.",
        f"Remove {arg}= from the Trainer (sprite fills it in) or launch with a matching value.",
    )


def _accelerator(launched: str, given) -> tuple[object, DeviceType]:
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
        raise _conflict("accelerator", given, f"accelerator {launched!r}")
    return given, kind or device_type(launched)


def _devices(cfg: RuntimeConfig, given):
    if given in (None, "auto", -1, "-1"):
        return cfg.devices
    if isinstance(given, (list, tuple)):
        count = len(given)
    else:
        count = len(str(given).split(",")) if "," in str(given) else int(given)
    if count != cfg.devices:
        raise _conflict("devices", given, f"{cfg.devices} rank(s) per node")
    return given


def _family(given) -> str:
    """"auto", "ddp", "fsdp", "single", or the strategy's own name for anything else."""
    if given in (None, "auto"):
        return "auto"
    if isinstance(given, Strategy):
        kinds = ((DDPStrategy, "ddp"), (ModelParallelStrategy, "fsdp"), (SingleDeviceStrategy, "single"))
        return next((name for cls, name in kinds if isinstance(given, cls)), type(given).__name__)
    if given.startswith("ddp") or given == XPUDDPStrategy.strategy_name:
        return "ddp"
    return {"fsdp2": "fsdp", "single_device": "single"}.get(given, given)


def _from_string(given):
    """Sprite's DDP for Lightning's DDP names (Lightning's own calls torch.cuda.stream off CUDA); else as given."""
    if isinstance(given, str) and _family(given) == "ddp" and given not in ("ddp_spawn", "ddp_fork"):
        return XPUDDPStrategy(find_unused_parameters=given.endswith("find_unused_parameters_true"))
    return given


def _strategy(cfg: RuntimeConfig, kind: DeviceType, given, devices):
    family = _family(given)
    wanted = cfg.strategy
    if wanted == "auto":
        if family != "auto" or cfg.world_size == 1:
            return _from_string(given) if given is not None else "auto"
        wanted = "ddp"
    if family == "auto":
        return make_strategy(wanted, kind, devices)
    if family != wanted:
        raise _conflict("strategy", given, f"strategy {wanted!r}")
    return given if isinstance(given, Strategy) else make_strategy(wanted, kind, devices)


def _precision(cfg: RuntimeConfig, kind: DeviceType, kwargs: dict, plugins: list) -> None:
    """Put the launch's (or the script's) mixed precision into ``plugins`` as an autocast plugin for ``kind``."""
    if any(isinstance(p, Precision) for p in plugins):
        return  # the script chose its own precision plugin
    given = kwargs.get("precision")
    target = given
    if cfg.precision != "auto":
        if given is not None and normalize_precision(given) != normalize_precision(cfg.precision):
            raise _conflict("precision", given, f"precision {cfg.precision!r}")
        target = cfg.precision
    if target is None:
        return
    if normalize_precision(target) in MIXED:
        kwargs.pop("precision", None)
        plugins.append(XPUMixedPrecision(target, kind.name))
    else:
        kwargs["precision"] = target


def launched_trainer_kwargs(cfg: RuntimeConfig, kwargs: dict) -> dict:
    """The script's Trainer kwargs with the launched world filled in.

    Raises:
        UsageError: an explicit argument (accelerator, devices, num_nodes, strategy, precision) contradicts the
            launch, the strategy is one sprite does not launch (strategy_check), or the rank variables conflict.
    """
    kwargs = dict(kwargs)
    if "num_nodes" in kwargs and int(kwargs["num_nodes"]) != cfg.num_nodes:
        raise _conflict("num_nodes", kwargs["num_nodes"], f"{cfg.num_nodes} node(s)")
    kwargs["num_nodes"] = cfg.num_nodes
    kwargs["accelerator"], kind = _accelerator(cfg.accelerator, kwargs.get("accelerator"))
    kwargs["devices"] = _devices(cfg, kwargs.get("devices"))
    strategy_check.check(cfg, kwargs.get("strategy"), resolved=False)
    kwargs["strategy"] = _strategy(cfg, kind, kwargs.get("strategy"), kwargs["devices"])
    strategy_check.check(cfg, kwargs["strategy"], resolved=True)
    plugins = _as_list(kwargs.get("plugins"))
    _precision(cfg, kind, kwargs, plugins)
    if cfg.world_size > 1 and cfg.launcher and not any(isinstance(p, ClusterEnvironment) for p in plugins):
        environment = ENVIRONMENTS[cfg.launcher]()
        environment.validate_settings(cfg.devices, cfg.num_nodes)
        plugins.append(environment)
    kwargs["plugins"] = plugins
    if cfg.checks != "off":
        kwargs["callbacks"] = [*_as_list(kwargs.get("callbacks")), FitChecks(cfg)]
    return kwargs


def install(cfg: RuntimeConfig) -> None:
    """Wrap ``lightning.pytorch.Trainer.__init__`` (the same class as ``lightning.Trainer``) for this launch."""
    from lightning.pytorch import Trainer

    original = Trainer.__init__
    if getattr(original, "_sprite_launch", None) is not None:
        original = original.__wrapped__

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        kwargs = launched_trainer_kwargs(cfg, kwargs)
        reporters = progress.callbacks()
        if reporters:  # the stall watchdog's heartbeat (progress.py)
            given = kwargs.get("callbacks")
            kwargs["callbacks"] = [*([] if given is None else given if isinstance(given, (list, tuple)) else
                                     [given]), *reporters]
        original(self, *args, **kwargs)

    __init__._sprite_launch = cfg
    Trainer.__init__ = __init__
