"""Make a plain ``Trainer(...)`` run the launched world: fill what the script left open, refuse contradictions.

``PL_TRAINER_*`` environment defaults cannot carry plugins (Lightning 2.6.6 utilities/argparse.py,
_defaults_from_env_vars), so sprite wraps ``lightning.pytorch.Trainer.__init__`` instead. Every check here runs
inside that call, before Lightning creates a process group; the fit-start checks go in as a callback (fit_checks),
and so does the heartbeat's reporter of steps and phases (ProgressCallback, writing through beats.py).
"""

from __future__ import annotations

import functools

from lightning.pytorch import Callback
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.strategies import Strategy

from sprite.runtime import launched_args, world_check
from sprite.runtime.checks import strategy as strategy_check
from sprite.runtime.config import RuntimeConfig
from sprite.runtime.ddp import XPUDDPStrategy
from sprite.runtime.devices import DeviceType
from sprite.runtime.checks.fit import FitChecks
from sprite.runtime.kwargs import make_strategy
from sprite.runtime.precision import MIXED, XPUMixedPrecision, normalize_precision
from sprite.contract import heartbeat
from sprite.runtime import beats as progress
from sprite.runtime.ckpt import cadence


def _from_string(given):
    """Sprite's DDP for Lightning's DDP names (Lightning's own calls torch.cuda.stream off CUDA); else as given."""
    if isinstance(given, str) and launched_args.family(given) == "ddp" and given not in ("ddp_spawn", "ddp_fork"):
        return XPUDDPStrategy(find_unused_parameters=given.endswith("find_unused_parameters_true"))
    return given


def _strategy(cfg: RuntimeConfig, kind: DeviceType, given, devices):
    wanted = launched_args.strategy_family("Trainer", cfg, given)
    if not wanted:
        return _from_string(given) if given is not None else "auto"
    return given if isinstance(given, Strategy) else make_strategy(wanted, kind, devices)


def _precision(cfg: RuntimeConfig, kind: DeviceType, kwargs: dict, plugins: list) -> None:
    """Put the launch's (or the script's) mixed precision into ``plugins`` as an autocast plugin for ``kind``. A
    precision plugin of the script's own is kept when it runs the launch's precision (or the launch named none).
    Raises UsageError when it or ``precision=`` contradicts the launch."""
    own = next((p for p in plugins if isinstance(p, Precision)), None)
    if own is not None:
        # Lightning's plugins name what they run (Precision.precision, "32-true" for the plain one)
        launched_args.precision_target("Trainer", cfg, getattr(own, "precision", "32-true"))
        return
    target = launched_args.precision_target("Trainer", cfg, kwargs.get("precision"))
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
    kwargs["num_nodes"] = launched_args.num_nodes("Trainer", cfg, kwargs.get("num_nodes"))
    kwargs["accelerator"], kind = launched_args.accelerator("Trainer", cfg.accelerator, kwargs.get("accelerator"))
    kwargs["devices"] = launched_args.devices("Trainer", cfg, kwargs.get("devices"))
    strategy_check.check(cfg, kwargs.get("strategy"), resolved=False)
    kwargs["strategy"] = _strategy(cfg, kind, kwargs.get("strategy"), kwargs["devices"])
    strategy_check.check(cfg, kwargs["strategy"], resolved=True)
    plugins = launched_args.as_list(kwargs.get("plugins"))
    _precision(cfg, kind, kwargs, plugins)
    launched_args.add_environment(cfg, plugins)
    kwargs["plugins"] = plugins
    if cfg.checks != "off":
        kwargs["callbacks"] = [*launched_args.as_list(kwargs.get("callbacks")), FitChecks(cfg)]
    return kwargs


def install(cfg: RuntimeConfig) -> None:
    """Wrap ``lightning.pytorch.Trainer.__init__`` (the same class as ``lightning.Trainer``) for this launch."""
    from lightning.pytorch import Trainer

    original = Trainer.__init__
    if getattr(original, "_sprite_launch", None) is not None:
        original = original.__wrapped__

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        world_check.seen("Trainer")
        kwargs = launched_trainer_kwargs(cfg, kwargs)
        reporters = [*progress_callbacks(), *cadence.callbacks()]  # heartbeat (beats.py), first step + cadence
        if reporters:  # the stall watchdog's heartbeat (progress.py)
            given = kwargs.get("callbacks")
            kwargs["callbacks"] = [*([] if given is None else given if isinstance(given, (list, tuple)) else
                                     [given]), *reporters]
        original(self, *args, **kwargs)

    __init__._sprite_launch = cfg
    Trainer.__init__ = __init__


class ProgressCallback(Callback):
    """Reports each step boundary and phase change of a fit to this rank's Heart."""

    def __init__(self, heart: progress.Heart) -> None:
        self.heart = heart
        self._before_validation = heartbeat.START

    def on_fit_start(self, trainer, pl_module):
        self.heart.update(heartbeat.START, trainer.global_step)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.heart.update(heartbeat.TRAINING, trainer.global_step)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.heart.update(step=trainer.global_step)

    def on_validation_start(self, trainer, pl_module):
        self._before_validation = self.heart.beat.phase
        self.heart.update(heartbeat.VALIDATION, trainer.global_step)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        self.heart.update()

    def on_validation_end(self, trainer, pl_module):
        self.heart.update(self._before_validation, trainer.global_step)

    def on_fit_end(self, trainer, pl_module):
        self.heart.update(heartbeat.DONE, trainer.global_step)


def progress_callbacks() -> list:
    """The heartbeat's reporter for a Trainer of this launch, when the launch asked for a heartbeat."""
    heart = progress.current()
    return [ProgressCallback(heart)] if heart is not None else []


def mark_saves() -> None:
    """Mark ``Trainer.save_checkpoint`` (ModelCheckpoint calls it too) as the checkpoint save phase."""
    from lightning.pytorch import Trainer

    original = Trainer.save_checkpoint
    if getattr(original, "_sprite_progress", False):
        return

    def save_checkpoint(self, *args, **kwargs):
        heart = progress.current()
        before = heart.beat.phase if heart else None
        if heart:
            heart.update(heartbeat.SAVE, self.global_step)
        try:
            return original(self, *args, **kwargs)
        finally:
            if heart:
                heart.update(before, self.global_step)

    save_checkpoint._sprite_progress = True
    save_checkpoint.__wrapped__ = original
    Trainer.save_checkpoint = save_checkpoint
