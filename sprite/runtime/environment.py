"""Lightning cluster environments for processes started by an external launcher, one class per flavour.

Modelled on lightning/fabric/plugins/environments/*.py. Ranks come from :func:`sprite.runtime.ranks.resolve_ranks`
(every variable the flavour knows must agree). Lightning computes a rank as node_rank * devices + local_rank and
sets it through ``set_global_rank``/``set_world_size``; a value different from the launched one raises there,
before any process group starts, instead of training another world than the one launched.
"""

from __future__ import annotations

import os
from typing import Optional

from lightning.fabric.plugins.environments import ClusterEnvironment
from lightning.fabric.utilities.rank_zero import rank_zero_only

from sprite import contract
from sprite.errors import UsageError
from sprite.runtime.ranks import Ranks, resolve_ranks


class _LaunchedEnvironment(ClusterEnvironment):
    """Base: processes exist already; ranks are read once from the environment, lazily."""

    flavour = "local"
    marker = "LOCAL_RANK"  # the variable whose presence says this launcher started us

    def __init__(self, env: Optional[dict] = None, hostname: Optional[str] = None) -> None:
        super().__init__()
        self._env, self._hostname = env, hostname
        self._ranks: Optional[Ranks] = None

    @property
    def ranks(self) -> Ranks:
        if self._ranks is None:
            env = os.environ if self._env is None else self._env
            self._ranks = resolve_ranks(env, self.flavour, self._hostname)
        return self._ranks

    @property
    def creates_processes_externally(self) -> bool:
        return True

    @property
    def main_address(self) -> str:
        env = os.environ if self._env is None else self._env
        hosts = env.get(contract.HOSTS, "").split(",")
        return env.get(contract.MASTER_ADDR) or hosts[0] or "127.0.0.1"

    @property
    def main_port(self) -> int:
        env = os.environ if self._env is None else self._env
        if not env.get(contract.MASTER_PORT, "").isdigit():
            raise UsageError(
                f"MASTER_PORT is {env.get(contract.MASTER_PORT)!r}, not a port number.",
                "The launcher did not export the rendezvous port.",
                "Launch through `sprite run`, or export MASTER_PORT=<port> to every rank.",
            )
        return int(env[contract.MASTER_PORT])

    @classmethod
    def detect(cls) -> bool:
        return cls.marker in os.environ

    def world_size(self) -> int:
        return self.ranks.world_size

    def set_world_size(self, size: int) -> None:
        self._check("world size", size, self.ranks.world_size)

    def global_rank(self) -> int:
        return self.ranks.global_rank

    def set_global_rank(self, rank: int) -> None:
        self._check("global rank", rank, self.ranks.global_rank)
        rank_zero_only.rank = rank

    def local_rank(self) -> int:
        return self.ranks.local_rank

    def node_rank(self) -> int:
        return self.ranks.node_rank

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        """Raises UsageError when ``num_devices * num_nodes`` is not the launched world size."""
        self._check("world size (devices x num_nodes)", num_devices * num_nodes, self.ranks.world_size)

    def _check(self, what: str, trainer_value: int, launched: int) -> None:
        if trainer_value != launched:
            raise UsageError(
                f"The Trainer's {what} is {trainer_value} but the {self.flavour} launcher started"
                f" {launched} for this process.",
                "The Trainer's devices or num_nodes do not match the launch.",
                "Make devices equal the ranks per node and num_nodes the node count of the launch, or leave them"
                " unset under `sprite run`.",
            )


class PALSEnvironment(_LaunchedEnvironment):
    """Aurora/Polaris PALS mpiexec: PALS_RANKID, PALS_LOCAL_RANKID, PMIX_RANK; world size from WORLD_SIZE."""

    flavour, marker = "pals", "PALS_RANKID"


class HydraEnvironment(_LaunchedEnvironment):
    """MPICH Hydra mpiexec: PMI_RANK, PMI_SIZE, MPI_LOCALRANKID."""

    flavour, marker = "hydra", "PMI_RANK"


class OpenMPIEnvironment(_LaunchedEnvironment):
    """Open MPI mpirun: OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK."""

    flavour, marker = "openmpi", "OMPI_COMM_WORLD_RANK"


class SrunEnvironment(_LaunchedEnvironment):
    """Slurm srun: SLURM_PROCID, SLURM_LOCALID, SLURM_NTASKS, SLURM_NODEID."""

    flavour, marker = "srun", "SLURM_PROCID"


class TorchrunEnvironment(_LaunchedEnvironment):
    """sprite's local supervisor and torchrun: RANK, LOCAL_RANK, WORLD_SIZE, NODE_RANK."""

    flavour, marker = "local", "LOCAL_RANK"


ENVIRONMENTS = {
    "pals": PALSEnvironment,
    "hydra": HydraEnvironment,
    "openmpi": OpenMPIEnvironment,
    "srun": SrunEnvironment,
    "local": TorchrunEnvironment,
    "torchrun": TorchrunEnvironment,
}
