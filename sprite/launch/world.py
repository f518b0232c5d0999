"""The launched world: how many nodes, ranks per node, which hosts and which launcher flavour.

Resolved from the user's job fields, the site profile and the allocation; every contradiction between them
is a UsageError that names both values.
"""

from __future__ import annotations

from dataclasses import dataclass

from sprite.schedulers import allocation as allocmod
from sprite import schedulers
from sprite.schedulers.allocation import Allocation
from sprite.errors import UsageError, preview
from sprite.spec.sites import SiteProfile
from sprite.spec.job import JobSpec


@dataclass(frozen=True)
class World:
    """Nodes x devices ranks on ``hosts`` (node-rank order), started by ``launcher`` of ``flavour``."""

    nodes: int
    devices: int
    hosts: tuple[str, ...]
    launcher: str  # mpiexec | srun | torchrun | local
    flavour: str  # the contract's LAUNCHER_FLAVOURS: local | pals | hydra | openmpi | srun | torchrun
    alloc: Allocation  # as granted by the scheduler, before --exclude

    @property
    def size(self) -> int:
        return self.nodes * self.devices

    @property
    def subset(self) -> bool:
        """True when the launch uses fewer hosts than the allocation has, so hosts must be named."""
        return self.hosts != self.alloc.hosts


def _launcher(spec: JobSpec, alloc: Allocation) -> str:
    scheduler = schedulers.get(alloc.scheduler)
    launcher = scheduler.auto_launcher if spec.launcher == "auto" else spec.launcher
    owner = next((s for s in schedulers.REGISTRY.values() if launcher in s.own_launchers), scheduler)
    if owner is not scheduler:
        raise UsageError(
            f"{spec.blame('launcher') if spec.launcher != 'auto' else '--launcher ' + launcher} needs a "
            f"{owner.label} allocation, and this run is not inside one.",
            f"sprite run was started on a login node or outside a {owner.label} job.",
            f"Run inside a {owner.label} job (or use sprite {owner.submit_program}), or choose --launcher "
            "local for this machine.",
        )
    return launcher


def _nodes(spec: JobSpec, alloc: Allocation, launcher: str) -> int:
    available = len(alloc.hosts)
    nodes = spec.nodes or (available - spec.spare_nodes if launcher != "local" else 1)
    if spec.spare_nodes and (nodes < 1 or nodes + spec.spare_nodes > available):
        raise UsageError(
            f"{spec.blame('spare_nodes')} leaves {max(available - spec.spare_nodes, 0)} of the {available} "
            f"allocated node(s) for a launch of {nodes}.",
            "Spare nodes are hosts of the allocation kept out of the first launch.",
            f"Use --spare-nodes {max(available - max(nodes, 1), 0)} or fewer, or ask the scheduler for more nodes.",
        )
    if nodes > available:
        if alloc.scheduler == "none" and not alloc.planned:
            raise UsageError(
                f"{spec.blame('nodes')} asks for {nodes} nodes, but no PBS or Slurm job runs here (PBS_JOBID and "
                f"SLURM_JOB_ID are unset), so sprite sees this machine alone ({preview(alloc.hosts)}).",
                "Nodes come from the scheduler; a login node or a laptop has none to spread ranks over.",
                f"Run it inside a {nodes}-node job (qsub -I, salloc), submit it with `sprite qsub JOB.yaml` "
                f"(nodes: {nodes}), or use --nodes 1.",
            )
        raise UsageError(
            f"{spec.blame('nodes')} asks for more nodes than {alloc.describe()} has ({available}: "
            f"{preview(alloc.hosts)}).",
            "The job was granted fewer nodes than the run asks for, or --exclude removed some.",
            f"Use --nodes {available} or fewer, or request more nodes from the scheduler.",
        )
    if nodes > 1 and launcher == "local":
        raise UsageError(
            f"--launcher local starts ranks on this machine only, but {spec.blame('nodes')}." if spec.nodes
            else f"--launcher local starts ranks on this machine only, but --nodes is {nodes}.",
            "local is sprite's single-machine supervisor.",
            "Use --launcher mpiexec, srun or torchrun inside an allocation, or --nodes 1.",
        )
    return nodes


def ranks_per_node(requested: int | None, site: SiteProfile, granted: int | None = None,
                   here: int | None = None) -> int:
    """Ranks per node: as requested, else as the allocation grants (Slurm), else the site's default, else
    ``here`` (one per visible accelerator on a machine without a scheduler, as ``Trainer(devices="auto")``), else 1.
    """
    return requested or granted or site.job.get("devices") or here or 1


def _devices(spec: JobSpec, site: SiteProfile, alloc: Allocation, here: int | None) -> int:
    devices = ranks_per_node(spec.devices, site, alloc.tasks_per_node, here)
    if alloc.tasks_per_node and devices > alloc.tasks_per_node:
        raise UsageError(
            f"{spec.blame('devices') if spec.devices else f'--devices {devices}'} asks for more ranks per node "
            f"than {alloc.describe()} grants ({alloc.tasks_per_node} tasks a node: SLURM_NTASKS_PER_NODE, or "
            "SLURM_TASKS_PER_NODE with SLURM_NTASKS).",
            "The allocation was requested with fewer tasks per node.",
            f"Use --devices {alloc.tasks_per_node} or fewer, or request --ntasks-per-node={devices}.",
        )
    return devices


def _flavour(spec: JobSpec, site: SiteProfile, launcher: str) -> str:
    if launcher == "mpiexec":
        return site.mpi if spec.mpi == "auto" else spec.mpi
    return launcher


def resolve(spec: JobSpec, site: SiteProfile, alloc: Allocation, here: int | None = None) -> World:
    """The world ``spec`` launches on ``alloc``; ``here``: ranks per node this machine's devices suggest.

    Raises UsageError for a request the allocation cannot hold.
    """
    granted = alloc
    if spec.exclude:
        if alloc.scheduler == schedulers.NONE.name:
            raise UsageError(f"{spec.blame('exclude')} needs a PBS or Slurm allocation; this run has none.",
                             "", "Drop --exclude for runs on this machine.")
        alloc = allocmod.exclude(alloc, spec.exclude, spec.origins.get("exclude", "--exclude"))
    launcher = _launcher(spec, alloc)
    nodes = _nodes(spec, alloc, launcher)
    devices = _devices(spec, site, alloc, here if alloc.scheduler == "none" else None)
    if spec.strategy == "single" and nodes * devices > 1:
        raise UsageError(
            f"{spec.blame('strategy')} runs one rank, but the launch asks for {nodes} node(s) x {devices} "
            "device(s).",
            "single is for one device; ddp and fsdp use several.",
            "Use --devices 1 --nodes 1 with single, or choose --strategy ddp or fsdp.",
        )
    return World(nodes, devices, alloc.hosts[:nodes], launcher, _flavour(spec, site, launcher), granted)
