"""Allocation discovery: which scheduler gave us which hosts, as pure functions of an environment mapping.

Each batch system reads its own variables (``sprite/schedulers/``); host order is kept and duplicates dropped:
the first host is the rendezvous host and host order is node-rank order.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Mapping

import hostlist

from sprite.errors import UsageError


@dataclass(frozen=True)
class Allocation:
    """Hosts granted by a scheduler. ``scheduler`` is a name of ``sprite.schedulers`` ("none": this machine)."""

    scheduler: str
    job_id: str
    hosts: tuple[str, ...]
    tasks_per_node: int | None = None
    nodefile: str | None = None


def unique(hosts) -> tuple[str, ...]:
    """Hosts in first-seen order without duplicates or blanks."""
    return tuple(dict.fromkeys(h.strip() for h in hosts if h.strip()))


def expand_hosts(text: str) -> tuple[str, ...]:
    """Expand a bracketed host list such as ``nid[001-003,007],gpu-[1-2]``. Raises hostlist.BadHostlist."""
    return unique(hostlist.expand_hostlist(text))


def discover(environ: Mapping[str, str], read: Callable[[str], str] = lambda p: Path(p).read_text(),
             hostname: str = "localhost") -> Allocation:
    """The allocation this process runs in: PBS first, then Slurm, else this machine alone."""
    from sprite import schedulers

    return schedulers.detect(environ).allocation(environ, read, hostname)


def exclude(alloc: Allocation, names: tuple[str, ...]) -> Allocation:
    """``alloc`` without the hosts in ``names`` (each may be a bracketed list). Raises UsageError if none remain."""
    dropped: set[str] = set()
    for name in names:
        try:
            dropped.update(expand_hosts(name))
        except hostlist.BadHostlist as err:
            raise UsageError(f"--exclude {name!r} is not a host name or host list ({err}).",
                             "A typo or an unbalanced bracket.", "Write hosts as nid001 or nid[001-003,007].") from None
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
