"""Allocation discovery: which scheduler gave us which hosts, as pure functions of an environment mapping.

PBS names its hosts in the file ``PBS_NODEFILE`` (one line per rank slot, so hosts repeat); Slurm in
``SLURM_JOB_NODELIST`` (compressed, e.g. ``nid[001-003,007],gpu-[1-2]``). Host order is kept and duplicates
dropped: the first host is the rendezvous host and host order is node-rank order.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Mapping

import hostlist

from sprite.errors import UsageError


@dataclass(frozen=True)
class Allocation:
    """Hosts granted by a scheduler. ``scheduler`` is "pbs", "slurm" or "none" (this machine only)."""

    scheduler: str
    job_id: str
    hosts: tuple[str, ...]
    tasks_per_node: int | None = None
    nodefile: str | None = None


def unique(hosts) -> tuple[str, ...]:
    """Hosts in first-seen order without duplicates or blanks."""
    return tuple(dict.fromkeys(h.strip() for h in hosts if h.strip()))


def expand_nodelist(text: str) -> tuple[str, ...]:
    """Expand a Slurm node list. Raises UsageError when it cannot be parsed."""
    try:
        return unique(hostlist.expand_hostlist(text))
    except hostlist.BadHostlist as err:
        raise UsageError(
            f"Cannot read the Slurm node list {text!r} ({err}).",
            "SLURM_JOB_NODELIST was edited or truncated by hand.",
            "Run inside an unmodified Slurm allocation, or unset SLURM_JOB_ID to launch on this machine only.",
        ) from None


def _tasks_per_node(value: str | None) -> int | None:
    # Slurm writes e.g. "4" or "4(x2)" or "4,2"; the first count is the one every full node gets.
    head = (value or "").split(",")[0].split("(")[0]
    return int(head) if head.isdigit() else None


def from_pbs(environ: Mapping[str, str], read: Callable[[str], str]) -> Allocation:
    """The PBS allocation described by ``environ``. Raises UsageError when PBS_NODEFILE is unusable."""
    path = environ.get("PBS_NODEFILE", "")
    try:
        hosts = unique(read(path).splitlines()) if path else ()
    except OSError as err:
        raise UsageError(
            f"PBS_NODEFILE={path} cannot be read ({err.strerror}).",
            "The job's node file is only present on the job's own nodes.",
            "Run sprite inside the PBS job (qsub -I or a job script).",
        ) from None
    if not hosts:
        raise UsageError(
            f"PBS_JOBID={environ['PBS_JOBID']} is set but PBS_NODEFILE names no hosts.",
            "The variable was copied into a shell outside the job, or the node file is empty.",
            "Run sprite inside the PBS job, or unset PBS_JOBID to launch on this machine only.",
        )
    return Allocation("pbs", environ["PBS_JOBID"], hosts, None, path)


def from_slurm(environ: Mapping[str, str]) -> Allocation:
    """The Slurm allocation described by ``environ``. Raises UsageError when the node list is missing."""
    text = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST", "")
    if not text:
        raise UsageError(
            f"SLURM_JOB_ID={environ['SLURM_JOB_ID']} is set but SLURM_JOB_NODELIST is empty.",
            "The variable was copied into a shell outside the job.",
            "Run sprite inside the allocation (salloc or an sbatch script), or unset SLURM_JOB_ID.",
        )
    tasks = _tasks_per_node(environ.get("SLURM_NTASKS_PER_NODE") or environ.get("SLURM_TASKS_PER_NODE"))
    return Allocation("slurm", environ["SLURM_JOB_ID"], expand_nodelist(text), tasks)


def discover(environ: Mapping[str, str], read: Callable[[str], str] = lambda p: Path(p).read_text(),
             hostname: str = "localhost") -> Allocation:
    """The allocation this process runs in: PBS first, then Slurm, else this machine alone."""
    if environ.get("PBS_JOBID"):
        return from_pbs(environ, read)
    if environ.get("SLURM_JOB_ID"):
        return from_slurm(environ)
    return Allocation("none", "", (hostname,))


def exclude(alloc: Allocation, names: tuple[str, ...]) -> Allocation:
    """``alloc`` without the hosts in ``names`` (each may be a Slurm-style list). Raises UsageError if none remain."""
    dropped = {h for name in names for h in expand_nodelist(name)}
    unknown = sorted(dropped - set(alloc.hosts))
    if unknown:
        raise UsageError(
            f"--exclude names {', '.join(unknown)}, which {'is' if len(unknown) == 1 else 'are'} not in the "
            f"allocation ({', '.join(alloc.hosts)}).",
            "A typo, or a host from another job.",
            "Exclude only hosts of this allocation (sprite env lists them).",
        )
    kept = tuple(h for h in alloc.hosts if h not in dropped)
    if not kept:
        raise UsageError("--exclude removes every host of the allocation.", "", "Keep at least one host.")
    return replace(alloc, hosts=kept)
