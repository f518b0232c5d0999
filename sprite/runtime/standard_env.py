"""The standard variables every launched rank gets before its script runs, from the launcher's own ones.

A plain ``torch.distributed`` script (``init_process_group("gloo")``, env:// rendezvous) reads ``RANK``,
``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT``; torchrun-style code also reads ``LOCAL_RANK``,
``LOCAL_WORLD_SIZE``, ``NODE_RANK`` and ``GROUP_RANK``. MPI launchers export none of them, so sprite writes them
from what :func:`sprite.runtime.ranks.resolve_ranks` read (every variable of the flavour must agree); a set value
that contradicts the launched one is refused, as a Trainer argument is.
"""

from __future__ import annotations

import re
import socket
import subprocess
from typing import Mapping, MutableMapping

from sprite import contract
from sprite.errors import UsageError
from sprite.runtime.config import RuntimeConfig
from sprite.runtime.ranks import FLAVOURS, Ranks, resolve_ranks


def standard(ranks: Ranks, cfg: RuntimeConfig) -> dict[str, str]:
    """The torchrun-style variables for this rank (``GROUP_RANK`` is torchrun's name for the node rank)."""
    return {"RANK": str(ranks.global_rank), "LOCAL_RANK": str(ranks.local_rank), "WORLD_SIZE": str(ranks.world_size),
            "LOCAL_WORLD_SIZE": str(cfg.devices), "NODE_RANK": str(ranks.node_rank),
            "GROUP_RANK": str(ranks.node_rank)}


def export(env: MutableMapping[str, str], cfg: RuntimeConfig) -> Ranks:
    """Write the standard variables (and ``MASTER_ADDR`` when the plan left it to the host list) into ``env``.

    Raises:
        UsageError: the launcher's variables contradict each other (resolve_ranks), a standard variable is set to
            another value than the launched one. A missing ``MASTER_PORT`` is left for the rendezvous to name.
    """
    if cfg.world_size == 1 and not any(env.get(name) for name in FLAVOURS[cfg.launcher].rank):
        ranks = Ranks(0, 0, 1, 0)  # one rank started by hand from a plan: it is rank 0 of its world
    else:
        ranks = resolve_ranks(env, cfg.launcher)
    wanted = standard(ranks, cfg)
    for name, value in wanted.items():
        given = env.get(name, "").strip()
        if given and given != value:
            raise UsageError(
                f"{name}={given} contradicts the launch, which makes this process {name}={value}.",
                "The variable was inherited from an outer launcher or job step, or set by hand.",
                f"Unset {name} before `sprite run` (env -u {name}); sprite exports it to every rank.",
            )
    env.update(wanted)
    if not env.get(contract.MASTER_ADDR):
        hosts = [h for h in env.get(contract.HOSTS, "").split(",") if h.strip()]
        env[contract.MASTER_ADDR] = hosts[0] if hosts else "127.0.0.1"
    if cfg.launcher == "srun" and ranks.world_size > 1:
        env[contract.MASTER_ADDR] = slurm_node_address(env[contract.MASTER_ADDR], env)
    return ranks


def _resolves(host: str) -> bool:
    try:
        socket.getaddrinfo(host, None)
        return True
    except (socket.gaierror, UnicodeError):
        return False


def slurm_node_address(host: str, env: Mapping[str, str]) -> str:
    """``host`` when it resolves (every real cluster); else Slurm's own address for that node name (its
    ``NodeAddr``, from ``scontrol show node``), as for several slurmd on one machine, where n1 and n2 are names
    only Slurm knows (NodeAddr=127.0.0.1). ``host`` unchanged when Slurm knows no other address."""
    if _resolves(host):
        return host
    try:
        shown = subprocess.run(["scontrol", "-o", "show", "node", host], env=dict(env), capture_output=True,
                               text=True, errors="replace", timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return host
    found = re.search(r"\bNodeAddr=(\S+)", shown)
    return found.group(1) if found else host


def bind_device(cfg: RuntimeConfig, local_rank: int) -> None:
    """Make ``local_rank`` the current xpu or cuda device, as Lightning does for a Trainer's rank, so that a plain
    script's ``torch.device("cuda")`` and its collectives use this rank's own device. CPU: nothing to bind."""
    import torch

    names = ("xpu", "cuda") if cfg.accelerator == "auto" else (cfg.accelerator,)
    for name in names:
        module = getattr(torch, name, None)
        if name != "cpu" and module is not None and module.is_available():
            if local_rank < module.device_count():
                module.set_device(local_rank)
            return
