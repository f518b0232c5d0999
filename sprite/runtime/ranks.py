"""Where a rank learns who it is: a pure function of an environment mapping, one table row per launcher flavour.

Every variable a flavour knows for a quantity is read; all that are set must agree. A stale ``RANK=0`` inherited
from an outer launcher therefore raises instead of making every rank rank 0.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from typing import Mapping, Optional

from sprite import contract
from sprite.errors import UsageError

_WORLD = ("WORLD_SIZE", contract.WORLD_SIZE)


@dataclass(frozen=True)
class Flavour:
    """The variables one launcher flavour exports, most specific first."""

    rank: tuple[str, ...]
    local_rank: tuple[str, ...]
    world_size: tuple[str, ...]
    node: tuple[str, ...] = ()
    node_names: tuple[str, ...] = ()  # the scheduler's own name for this node (matched against SPRITE_HOSTS)


FLAVOURS: dict[str, Flavour] = {
    "pals": Flavour(
        ("PALS_RANKID", "PMIX_RANK", "PMI_RANK", "RANK"),
        ("PALS_LOCAL_RANKID", "PMI_LOCAL_RANK", "LOCAL_RANK"),
        ("PMI_SIZE", *_WORLD),  # PALS itself exports no world size
        ("PALS_NODEID",),
    ),
    "hydra": Flavour(("PMI_RANK", "RANK"), ("MPI_LOCALRANKID", "LOCAL_RANK"), ("PMI_SIZE", *_WORLD)),
    "openmpi": Flavour(
        ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "RANK"),
        ("OMPI_COMM_WORLD_LOCAL_RANK", "LOCAL_RANK"),
        ("OMPI_COMM_WORLD_SIZE", *_WORLD),
        ("OMPI_COMM_WORLD_NODE_RANK",),
    ),
    "srun": Flavour(
        ("SLURM_PROCID", "RANK"), ("SLURM_LOCALID", "LOCAL_RANK"), ("SLURM_NTASKS", *_WORLD), ("SLURM_NODEID",),
        ("SLURMD_NODENAME",),
    ),
    "local": Flavour(("RANK",), ("LOCAL_RANK",), _WORLD, ("NODE_RANK", "GROUP_RANK")),
}
FLAVOURS["torchrun"] = FLAVOURS["local"]


@dataclass(frozen=True)
class Ranks:
    global_rank: int
    local_rank: int
    world_size: int
    node_rank: int


def read_rank_var(env: Mapping[str, str], names: tuple[str, ...], what: str, flavour: str = "") -> Optional[int]:
    """The one value all set ``names`` agree on; None when none is set, unless ``flavour`` requires one.

    Raises:
        UsageError: a value is not an integer, two set variables disagree (naming each variable and value), or
            ``flavour`` is given and none of ``names`` is set.
    """
    found: dict[str, int] = {}
    for name in names:
        raw = env.get(name)
        if raw is None or raw.strip() == "":
            continue
        try:
            found[name] = int(raw)
        except ValueError:
            raise UsageError(
                f"{name}={raw!r} is not an integer, so this process cannot know its {what}.",
                "The variable was overwritten by a script or an outer tool.",
                f"Unset {name} or give it the integer the launcher meant.",
            ) from None
    if len(set(found.values())) > 1:
        listing = ", ".join(f"{k}={v}" for k, v in found.items())
        raise UsageError(
            f"Conflicting {what} for this process: {listing}.",
            "A variable was inherited from an outer launcher or job step (a stale RANK=0 is typical).",
            "Unset the stale variables before launching, e.g. `env -u RANK -u LOCAL_RANK -u WORLD_SIZE ...`.",
        )
    if flavour and not found:
        raise UsageError(
            f"No {what} for this process: none of {', '.join(names)} is set.",
            f"The '{flavour}' launcher did not start this process, or did not export its {what}.",
            "Start ranks through `sprite run`, or export WORLD_SIZE=<ranks> (mpiexec --env WORLD_SIZE=<ranks>)"
            if what == "world size"
            else "Start ranks through `sprite run` with the launcher that matches SPRITE_LAUNCHER.",
        )
    return next(iter(found.values()), None)


def _loopback(host: str) -> bool:
    """Whether ``host`` is a loopback name or address: every 127.x.y.z is this machine."""
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def node_from_hosts(hosts: list[str], hostname: str, names: tuple[str, ...] = (), launcher_node: Optional[int] = None
                    ) -> int:
    """This host's index in the launcher's host list, matching full or short names.

    ``names`` are other names the scheduler itself gives this node (Slurm's ``SLURMD_NODENAME``). A loopback
    entry (127.x.y.z, localhost) is this machine. When several entries are this machine (simulated nodes on one
    machine: a PBS nodefile of 127.0.0.1 and 127.0.0.2 under Hydra's fork bootstrap), the host list cannot tell
    them apart and ``launcher_node`` (the launcher's node id, or rank // ranks-per-node) must be one of them.
    A real allocation lists each node once by name, so this never loosens the check there.

    Raises:
        UsageError: this host is not in the list (or is several times, and ``launcher_node`` is none of them).
    """
    mine = {hostname, hostname.split(".")[0], *names}
    matches = [index for index, host in enumerate(hosts)
               if host in mine or host.split(".")[0] in mine or _loopback(host)]
    if len(matches) == 1:
        return matches[0]
    if matches and launcher_node in matches:
        return launcher_node
    raise UsageError(
        f"This host ({hostname}) is not in {contract.HOSTS}={','.join(hosts)}." if not matches else
        f"This host ({hostname}) is entries {matches} of {contract.HOSTS}={','.join(hosts)}, and the launcher put"
        f" this rank on node {launcher_node}.",
        "The ranks were placed on other nodes than the plan's host list (a hand-written host file, or a changed"
        " allocation).",
        "Launch through `sprite run` inside the allocation so the host list and the placement agree.",
    )


def resolve_ranks(env: Mapping[str, str], flavour: str, hostname: Optional[str] = None) -> Ranks:
    """Global rank, local rank, world size and node rank of this process under launcher ``flavour``.

    Raises:
        UsageError: unknown flavour; a value missing, non-integer, out of range or contradicting another;
            this host not in SPRITE_HOSTS; ranks not placed in blocks of ranks-per-node.
    """
    if flavour not in FLAVOURS:
        raise UsageError(f"Unknown launcher {flavour!r}.", "sprite reads ranks only for the flavours it launches.",
                         f"Use one of: {', '.join(FLAVOURS)}.")
    spec = FLAVOURS[flavour]
    rank = read_rank_var(env, spec.rank, "rank", flavour)
    local = read_rank_var(env, spec.local_rank, "local rank", flavour)
    world = read_rank_var(env, spec.world_size, "world size", flavour)
    if not 0 <= rank < world or not 0 <= local <= rank:
        raise UsageError(
            f"Rank {rank} (local rank {local}) does not fit a world of {world} processes.",
            "WORLD_SIZE or SPRITE_WORLD_SIZE was left over from another launch.",
            "Unset it, or relaunch with `sprite run` so every rank gets the same world size.",
        )
    # MPICH's MPI_LOCALNRANKS counts this launcher's processes a node; under torchrun started by mpiexec (one agent
    # a node) it is the agent's 1 and not the ranks', so only an MPICH flavour reads it.
    mpich = ("MPI_LOCALNRANKS",) if flavour in ("hydra", "pals") else ()
    per_node = read_rank_var(env, (contract.DEVICES, "LOCAL_WORLD_SIZE", *mpich), "ranks per node")
    nodes = read_rank_var(env, (contract.NUM_NODES,), "node count") or 1
    per_node = per_node or max(world // nodes, 1)
    hosts = [h for h in env.get(contract.HOSTS, "").split(",") if h.strip()]
    node = read_rank_var(env, spec.node, "node rank")
    node = rank // per_node if node is None else node
    if hosts:
        names = tuple(env[name] for name in spec.node_names if env.get(name))
        node = node_from_hosts(hosts, hostname or socket.gethostname(), names, node)
    if rank != node * per_node + local:
        raise UsageError(
            f"Rank {rank} is local rank {local} on node {node}, but with {per_node} ranks per node it must be"
            f" rank {node * per_node + local}.",
            "The launcher placed ranks round-robin or unevenly across nodes; Lightning numbers ranks in blocks.",
            "Place ranks in blocks (mpiexec --ppn N, srun --distribution=block) with the same count on every node.",
        )
    return Ranks(rank, local, world, node)


def detect_flavour(env: Mapping[str, str]) -> Optional[str]:
    """The launcher flavour: SPRITE_LAUNCHER if set, else guessed from the variables present, else None."""
    named = env.get(contract.LAUNCHER)
    if named:
        return named
    for flavour, marker in (("pals", "PALS_RANKID"), ("openmpi", "OMPI_COMM_WORLD_RANK"), ("hydra", "PMI_RANK")):
        if marker in env:
            return flavour
    return "local" if "LOCAL_RANK" in env else None
