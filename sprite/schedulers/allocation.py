"""Allocation discovery: which scheduler gave us which hosts, as pure functions of an environment mapping.

Each batch system reads its own variables (``sprite/schedulers/``); host order is kept and duplicates dropped:
the first host is the rendezvous host and host order is node-rank order.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, replace

import hostlist

from sprite.errors import UsageError, preview, show
from sprite.values.grammar import HOST

JOB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\[\]-]{0,127}")  # 123, 8505298.aurora-pbsadmin-0001, 77[3].pbs
MAX_NODEFILE = 64 * 1024 * 1024


@dataclass(frozen=True)
class Allocation:
    """Hosts granted by a scheduler. ``scheduler`` is a name of ``sprite.schedulers`` ("none": this machine)."""

    scheduler: str
    job_id: str
    hosts: tuple[str, ...]
    tasks_per_node: int | None = None
    nodefile: str | None = None
    planned: bool = False  # True: the allocation a job script requests, planned before submission

    def describe(self) -> str:
        """How messages name it: "the SLURM allocation 4242", "the requested PBS allocation", "this machine"."""
        if self.planned:
            return f"the requested {self.scheduler.upper()} allocation"
        return f"the {self.scheduler.upper()} allocation {self.job_id}" if self.job_id else "this machine"


def unique(hosts) -> tuple[str, ...]:
    """Hosts in first-seen order without duplicates or blanks."""
    return tuple(dict.fromkeys(h.strip() for h in hosts if h.strip()))


def expand_hosts(text: str) -> tuple[str, ...]:
    """Expand a bracketed host list such as ``nid[001-003,007],gpu-[1-2]``. Raises hostlist.BadHostlist."""
    return unique(hostlist.expand_hostlist(text))


def check_job_id(variable: str, value: str) -> str:
    """``value`` when it is a job id. Raises UsageError naming ``variable`` (a damaged or hand-set variable)."""
    if not JOB_ID.fullmatch(value):
        raise UsageError(f"{variable}={show(value)} is not a job id.", "The variable was set by hand, copied from "
                         "elsewhere or damaged.", f"Run inside a real job, or unset {variable} to launch here only.")
    return value


def check_hosts(lines, where: str, entry: str = "line") -> tuple[str, ...]:
    """The unique host names of ``lines`` (blank lines skipped). Raises UsageError naming ``where`` and the
    ``entry`` (a node file's line, or a node list's host once expanded) of the first that is not a host name
    (``nid001,nid002`` on one line is two hosts, not a name)."""
    for number, line in enumerate(lines, 1):
        if line.strip() and not HOST.fullmatch(line.strip()):
            if entry == "line":
                cause, fix = ("The file was written by hand or damaged; the scheduler writes one host per line.",
                              "Run inside the job, or fix the file to hold one host name per line.")
            else:
                cause, fix = ("The variable was set by hand or damaged.",
                              "Run inside an unmodified allocation, or unset the job's variables to launch here.")
            raise UsageError(f"{where} {entry} {number}: {show(line.strip())} is not a host name.", cause, fix)
    return unique(lines)


def read_text(path: str) -> str:
    """A node file's text. Raises UsageError for a file that is not regular, or bytes that are not UTF-8 or a
    NUL (naming the line; the caller names the variable and path), OSError when it cannot be read."""
    with os.fdopen(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC), "rb") as handle:  # a FIFO: no wait
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise UsageError("is not a regular file.", "The variable names a device, pipe or folder, not the "
                             "scheduler's node file.", "Run inside the job, or unset the variable.")
        data = handle.read(MAX_NODEFILE + 1)
    bad = data.find(b"\0") if b"\0" in data else None
    try:
        text = data[:MAX_NODEFILE].decode("utf-8")
    except UnicodeDecodeError as err:
        bad = err.start if bad is None else min(bad, err.start)
    if bad is not None or len(data) > MAX_NODEFILE:
        line = data.count(b"\n", 0, bad) + 1 if bad is not None else "?"
        raise UsageError(f"line {line}: is not a host list (bytes that are not UTF-8 text, or more than 64 MB).",
                         "The file is damaged or is not the scheduler's node file.",
                         "Run inside the job, or point the variable at the job's own node file.")
    return text


def exclude(alloc: Allocation, names: tuple[str, ...], label: str = "--exclude") -> Allocation:
    """``alloc`` without the hosts in ``names`` (each may be a bracketed list); ``label`` says where they were
    written (``--exclude`` or ``job.yaml:4: key 'exclude'``). Raises UsageError if one is not in the allocation
    or none remain."""
    dropped: set[str] = set()
    for name in names:
        try:
            dropped.update(expand_hosts(name))
        except hostlist.BadHostlist as err:
            raise UsageError(f"{label}: {show(name)} is not a host name or host list ({err}).",
                             "A typo or an unbalanced bracket.", "Write hosts as nid001 or nid[001-003,007].") from None
    named = len(dropped)
    dropped, unknown = _as_allocated(dropped, alloc.hosts)
    if unknown and alloc.planned:
        raise UsageError(f"{label} names {named} hosts, more than the {len(alloc.hosts)} node(s) the job asks "
                         "for, so some cannot be in its allocation.", "",
                         "Exclude fewer hosts, or ask for more nodes (scheduler.nodes).")
    if unknown:
        raise UsageError(
            f"{label} names {preview(unknown)}, which {'is' if len(unknown) == 1 else 'are'} not in the "
            f"allocation ({preview(alloc.hosts)}).",
            "A typo, or a host from another job.",
            "Exclude only hosts of this allocation (sprite env lists them).",
        )
    kept = tuple(h for h in alloc.hosts if h not in dropped)
    if not kept:
        raise UsageError(f"{label} removes every host of {alloc.describe()}.", "", "Keep at least one host.")
    return replace(alloc, hosts=kept)


def _as_allocated(names: set[str], hosts: tuple[str, ...]) -> tuple[set[str], list[str]]:
    """(the hosts of ``hosts`` that ``names`` name, the names that name none). A name matches a host spelled the
    same, or, where one of the two has no domain, the same short name: Aurora's node file holds
    ``x4000c0s0b0n0.hostmgmt2000.cm.aurora.alcf.anl.gov`` while a user (or a heartbeat's gethostname) writes
    ``x4000c0s0b0n0``."""
    spelled = set(hosts)
    by_short: dict[str, list[str]] = {}
    for host in hosts:
        by_short.setdefault(host.split(".")[0], []).append(host)
    found, unknown = set(), []
    for name in names:
        if name in spelled:
            found.add(name)
            continue
        short = [h for h in by_short.get(name.split(".")[0], []) if "." not in name or "." not in h]
        if short:
            found.update(short)
        else:
            unknown.append(name)
    return found, sorted(unknown)
