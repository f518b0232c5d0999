"""What a site and a batch system accept of a scheduler block: the site's queue table and node limit, the
scheduler's range for a warning signal, and the directive options sprite writes itself (an ``extra`` item may not
override them, or the checks of their keys would not see it).

The site's ``queues:`` table (queue name -> min_nodes, max_nodes, max_walltime) lets sprite refuse what the
site would refuse at qsub/sbatch time. Every rejection names the file, line and key it comes from.
"""

from __future__ import annotations

from typing import Callable

from sprite.values import scheduler as sv
from sprite.values import grammar as v
from sprite.values.env import hide_values
from sprite.errors import UsageError, one_line, show
from sprite.spec.yamldoc import YamlDoc

QUEUE_KEYS = {"min_nodes": v.nodes, "max_nodes": v.nodes, "max_walltime": sv.walltime}


def check_queues(doc: YamlDoc, section: tuple = ("queues",)) -> dict:
    """A site's queue table: {queue: {min_nodes, max_nodes, max_walltime}}. Raises SpecError for bad entries."""
    table = doc.data.get(section[0]) or {}
    if not isinstance(table, dict):
        raise doc.error(section, f"{show(table)} is not a mapping of queue names.", "queue: {max_nodes: N, ...}")
    out = {}
    for queue, limits in table.items():
        complain_for = doc.complainer((*section, str(queue)))
        sv.name(queue, doc.complainer(section)(str(queue)))
        if not isinstance(limits, dict):
            raise doc.error((*section, str(queue)), "is not a mapping of limits.", ", ".join(QUEUE_KEYS))
        for key in limits:
            if key not in QUEUE_KEYS:
                raise complain_for(key)("is not a queue limit.", ", ".join(QUEUE_KEYS))
        out[str(queue)] = {key: QUEUE_KEYS[key](value, complain_for(key)) for key, value in limits.items()}
    return out


def check_queue(block: dict, queues: dict, complain_for: Callable) -> None:
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
    if top and sv.seconds(block["walltime"]) > sv.seconds(top):
        raise complain_for("walltime")(f"{block['walltime']} is longer than the '{queue}' queue allows ({top}).",
                                          f"at most {top}, or another queue: " + ", ".join(queues))


def check(block: dict, site, scheduler, given: dict, complain_for: Callable) -> None:
    """Refuse nodes beyond the site's max_nodes, a warning signal due before the job starts or beyond what the
    scheduler accepts, and an ``extra`` option that would override a directive sprite writes from a key.

    Raises SpecError naming the spec's key (UsageError naming the profile for the site's ``submit.extra``).
    """
    top = site.limits.get("max_nodes")
    if top and block["nodes"] > top:
        raise complain_for("nodes")(f"{block['nodes']} nodes is more than {site.name} has ({top}, limits.max_nodes "
                                    f"in {site.source}).", f"at most {top}")
    if block.get("preempt_signal"):
        _check_signal(block, scheduler, complain_for("preempt_signal"))
    for item in block.get("extra", ()):
        complain = complain_for("extra") if "extra" in given else lambda what, allowed: UsageError(
            f"{site.source}: key 'submit.extra': {what}", "", f"Allowed: {allowed}.")
        owner = scheduler.owner_of(item)
        quoted = repr(one_line(hide_values(item), 80))  # a secret-looking assignment's value hidden
        if owner:
            fix = f"scheduler.{owner}" if owner != "devices" else "devices:"
            raise complain(f"{quoted} sets what sprite writes from {fix}, so the checks of that "
                           "key (queue limits, the planned launch) would not see it.", f"{fix} instead")
        why = scheduler.requeue_options.get(item.split(" ")[0].split("=")[0]) if block.get("requeue") else None
        if why:
            raise complain(f"{quoted} overrides what sprite writes for scheduler.requeue: true "
                           f"({why}).", "extra without it, or requeue: false")


def _check_signal(block: dict, scheduler, complain) -> None:
    signal, before = block["preempt_signal"]
    longest = min(sv.seconds(block["walltime"]) - 1, scheduler.max_signal_lead or before)
    if before > longest:
        cap = f" and {scheduler.label} takes at most {scheduler.max_signal_lead} s" if scheduler.max_signal_lead else ""
        raise complain(f"{signal}@{before} asks for the signal {before} s before the end, but the walltime is "
                       f"{block['walltime']}{cap}.", f"SIGNAL@SECONDS with SECONDS from 1 to {longest}, e.g. "
                       f"USR1@{min(90, longest)}")
