"""SchedulerBlock: the validated ``scheduler:`` block of a job spec, merged over the site profile's ``submit:``.

The site's ``queues:`` table (queue name -> min_nodes, max_nodes, max_walltime) lets sprite refuse what the
site would refuse at qsub/sbatch time. Every rejection names the file, line and key it comes from.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Callable

from sprite import schedulers
from sprite import values as v
from sprite.yamldoc import YamlDoc

# Keys every batch system understands; each scheduler module adds its own (``Scheduler.block_checks``).
COMMON: dict[str, Callable] = {
    "account": v.token, "queue": v.name, "walltime": v.walltime, "nodes": v.count, "job_name": v.name,
    "output_dir": v.token, "dependency": v.dependency, "preempt_signal": v.preempt_signal, "requeue": v.flag,
    "extra": v.directives, "setup": v.setup, "python": v.token,
}


def checks() -> dict[str, Callable]:
    """Every scheduler-block key and its checker: the common ones, then each batch system's own."""
    return {**COMMON, **{key: check for s in schedulers.batch() for key, check in s.block_checks.items()}}


def owners() -> dict[str, str]:
    """The keys only one batch system understands (filesystems -> pbs), as each scheduler module declares them."""
    return {key: s.name for s in schedulers.batch() for key in s.block_checks}
NOT_IN_SITE = ("output_dir", "dependency", "job_name")  # per job, never a site default
QUEUE_KEYS = {"min_nodes": v.count, "max_nodes": v.count, "max_walltime": v.walltime}


@dataclass(frozen=True)
class SchedulerBlock:
    """Everything a job script needs besides the launch itself. ``kind`` names a batch system of sprite.schedulers."""

    kind: str
    nodes: int
    walltime: str
    job_name: str
    output_dir: str
    account: str | None = None
    queue: str | None = None
    dependency: tuple = ()
    preempt_signal: tuple | None = None  # (signal name, seconds before the walltime ends)
    requeue: bool | None = None
    extra: tuple = ()
    setup: tuple = ()
    python: str | None = None
    filesystems: tuple = ()
    place: str | None = None
    select: str | None = None
    partition: str | None = None
    constraint: str | None = None
    gpus_per_node: int | None = None
    cpus_per_task: int | None = None
    options: dict = field(default_factory=dict)  # keys of a batch system that has no field here (a new one's)
    pass_env: tuple = ()  # variables the job takes from the submitting environment (secrets among them)


def check_block(doc: YamlDoc, section: tuple, kind: str | None, site: bool = False) -> dict:
    """Validated values of the mapping at ``section`` of ``doc``; ``kind`` (a batch system) refuses other systems' keys.

    Raises SpecError naming file, line and key for an unknown key, a key of the other scheduler or a bad value.
    """
    raw = doc.mapping(section)
    complain_for = doc.complainer(section)
    table, only = checks(), owners()
    allowed = [key for key in table if not (site and key in NOT_IN_SITE)]
    out = {}
    for key, value in raw.items():
        if key not in allowed:
            raise complain_for(key)("is not a scheduler key" + (" of a site profile." if site else "."),
                                    ", ".join(allowed))
        if kind and only.get(key, kind) != kind:
            raise complain_for(key)(f"is a {only[key].upper()} key, but this job goes to {kind.upper()}.",
                                    ", ".join(k for k in allowed if only.get(k, kind) == kind))
        out[key] = table[key](value, complain_for(key))
    return out


def check_queues(doc: YamlDoc, section: tuple = ("queues",)) -> dict:
    """A site's queue table: {queue: {min_nodes, max_nodes, max_walltime}}. Raises SpecError for bad entries."""
    table = doc.data.get(section[0]) or {}
    if not isinstance(table, dict):
        raise doc.error(section, f"{table!r} is not a mapping of queue names.", "queue: {max_nodes: N, ...}")
    out = {}
    for queue, limits in table.items():
        complain_for = doc.complainer((*section, str(queue)))
        v.name(queue, doc.complainer(section)(str(queue)))
        if not isinstance(limits, dict):
            raise doc.error((*section, str(queue)), "is not a mapping of limits.", ", ".join(QUEUE_KEYS))
        for key in limits:
            if key not in QUEUE_KEYS:
                raise complain_for(key)("is not a queue limit.", ", ".join(QUEUE_KEYS))
        out[str(queue)] = {key: QUEUE_KEYS[key](value, complain_for(key)) for key, value in limits.items()}
    return out


def _check_queue(block: dict, queues: dict, complain_for: Callable) -> None:
    queue = block.get("queue")
    if not queues or queue is None:
        return
    if queue not in queues:
        raise complain_for("queue")(f"'{queue}' is not a queue of this site.", ", ".join(queues))
    limits, nodes = queues[queue], block["nodes"]
    if nodes > limits.get("max_nodes", nodes) or nodes < limits.get("min_nodes", 1):
        raise complain_for("nodes")(
            f"{nodes} node(s) is outside the '{queue}' queue's {limits.get('min_nodes', 1)}-"
            f"{limits.get('max_nodes', 'any')} nodes; the scheduler would refuse the job.",
            "a node count within the queue's limits, or another queue: " + ", ".join(queues))
    top = limits.get("max_walltime")
    if top and v.seconds(block["walltime"]) > v.seconds(top):
        raise complain_for("walltime")(f"{block['walltime']} is longer than the '{queue}' queue allows ({top}).",
                                          f"at most {top}, or another queue: " + ", ".join(queues))


def resolve(kind: str, doc: YamlDoc, site, job, cwd: str) -> SchedulerBlock:
    """Merge the site's ``submit:`` defaults and the spec's ``scheduler:`` block into a SchedulerBlock.

    ``job`` is the merged JobSpec (its ``nodes`` is the default node count). Raises SpecError naming the spec
    file's line and key for a missing walltime, an unknown queue or a request beyond the queue's limits.
    """
    # A spec for a scheduler-less site (local) may hold keys of both kinds; the other kind's are unused.
    given = check_block(doc, ("scheduler",), kind if schedulers.get(site.scheduler).submit_program else None)
    block = {**site.submit, **given}

    nodes_key = ("scheduler", "nodes") if "nodes" in given or not job.nodes else ("nodes",)

    def complain_for(key: str) -> Callable:
        path = nodes_key if key == "nodes" else ("scheduler", key)
        return lambda what, allowed="": doc.error(path, what, allowed)

    block.setdefault("nodes", job.nodes or 1)
    if job.nodes and job.nodes > block["nodes"]:
        raise doc.error(nodes_key, f"the job runs on {job.nodes} nodes but the scheduler block asks for "
                        f"{block['nodes']}.", f"scheduler.nodes of at least {job.nodes}, or leave it out")
    if "walltime" not in block:
        raise complain_for("walltime")("is missing, and the site profile gives no default.",
                                          'a walltime such as "00:30:00"')
    _check_queue(block, site.queues, complain_for)
    spec_dir = Path(doc.source).resolve().parent
    block["output_dir"] = str(spec_dir / given["output_dir"]) if "output_dir" in given else str(
        Path(cwd) / "sprite-jobs")
    block.setdefault("job_name", re.sub(r"[^A-Za-z0-9_.-]", "-", Path(doc.source).name.split(".")[0]) or "sprite")
    known = {f.name for f in fields(SchedulerBlock)}
    options = {key: value for key, value in block.items() if key not in known}
    return SchedulerBlock(kind=kind, options=options, **{key: value for key, value in block.items() if key in known})
