"""``RuntimeConfig``: the launched world as the launcher described it in the ``SPRITE_*`` variables."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Optional

from sprite import contract
from sprite.errors import UsageError
from sprite.runtime.ranks import FLAVOURS, detect_flavour

ACCELERATORS = contract.ACCELERATORS
STRATEGIES = contract.STRATEGIES
_CAUSE = "sprite run never exports it so: it was set by hand or changed after the launch."


@dataclass(frozen=True)
class RuntimeConfig:
    accelerator: str  # auto | xpu | cuda | cpu
    strategy: str  # auto | single | ddp | fsdp
    precision: str  # a Lightning precision, or "auto" = keep the script's
    num_nodes: int
    devices: int  # ranks per node
    world_size: int
    launcher: Optional[str]  # a launcher flavour, None for a process nobody launched
    checks: str = "on"  # on | off | strict: the fit-start contract checks (sprite/runtime/checks/fit.py)


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    if not raw.isdigit() or int(raw) < 1:
        raise UsageError(f"{name}={raw!r} is not a positive integer.", _CAUSE,
                         f"Unset {name} or relaunch with sprite run.")
    return int(raw)


def _choice(env: Mapping[str, str], name: str, allowed: tuple[str, ...], default: str = "auto") -> str:
    value = env.get(name, "").strip() or default
    if value not in allowed:
        raise UsageError(f"{name}={value!r} is not allowed.", _CAUSE, f"Use one of: {', '.join(allowed)}.")
    return value


def from_env(env: Mapping[str, str]) -> Optional[RuntimeConfig]:
    """The launched world, or None when no ``SPRITE_*`` variable is set (run by hand as one process).

    Raises:
        UsageError: a value is malformed, or world size differs from num_nodes x devices.
    """
    if not any(env.get(name) for name in contract.ALL):
        return None
    nodes = _int(env, contract.NUM_NODES, 1)
    world = _int(env, contract.WORLD_SIZE, _int(env, "WORLD_SIZE", nodes * _int(env, contract.DEVICES, 1)))
    devices = _int(env, contract.DEVICES, max(world // nodes, 1))
    if world != nodes * devices:
        raise UsageError(
            f"{contract.WORLD_SIZE}={world} is not {contract.NUM_NODES}={nodes} x {contract.DEVICES}={devices}.",
            "The variables come from different launches.",
            "Relaunch with `sprite run` so all of them are set together.",
        )
    strategy = _choice(env, contract.STRATEGY, STRATEGIES)
    if strategy == "single" and world > 1:
        raise UsageError(
            f"{contract.STRATEGY}=single in a launched world of {world} processes.",
            "A single-device run trains one process; every other rank would train alone.",
            "Launch one rank (--devices 1 --nodes 1) or choose ddp or fsdp.",
        )
    launcher = detect_flavour(env)
    if launcher is not None and launcher not in FLAVOURS:
        raise UsageError(f"{contract.LAUNCHER}={launcher!r} is not allowed.", _CAUSE,
                         f"Use one of: {', '.join(FLAVOURS)}.")
    return RuntimeConfig(
        accelerator=_choice(env, contract.ACCELERATOR, ACCELERATORS),
        strategy=strategy,
        precision=env.get(contract.PRECISION, "").strip() or "auto",
        num_nodes=nodes,
        devices=devices,
        world_size=world,
        launcher=launcher,
        checks=_choice(env, contract.CHECKS, contract.CHECK_MODES, "on"),
    )
