"""SchedulerBlock: the validated ``scheduler:`` block of a job spec, merged over the site profile's ``submit:``.

What the site and the batch system accept of it (queue limits, node limits, signal lead, options sprite writes
itself) is checked by ``sprite.spec.block_limits``. Every rejection names the file, line and key it comes from.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Callable

from sprite import schedulers
from sprite.spec import block_limits
from sprite.values import scheduler as sv
from sprite.values import grammar as v
from sprite.errors import one_line
from sprite.spec.yamldoc import YamlDoc

# Keys every batch system understands; each scheduler module adds its own (``Scheduler.block_checks``).
COMMON: dict[str, Callable] = {
    "account": sv.token, "queue": sv.name, "walltime": sv.walltime, "nodes": v.nodes, "job_name": sv.name,
    "output_dir": sv.token, "dependency": sv.dependency, "preempt_signal": sv.preempt_signal, "requeue": v.flag,
    "extra": sv.directives, "setup": sv.setup, "python": sv.program,
}


def checks() -> dict[str, Callable]:
    """Every scheduler-block key and its checker: the common ones, then each batch system's own."""
    return {**COMMON, **{key: check for s in schedulers.batch() for key, check in s.block_checks.items()}}


def owners() -> dict[str, str]:
    """The keys only one batch system understands (filesystems -> pbs), as each scheduler module declares them."""
    return {key: s.name for s in schedulers.batch() for key in s.block_checks}


NOT_IN_SITE = ("output_dir", "dependency", "job_name")  # per job, never a site default


@dataclass(frozen=True)
class SchedulerBlock:
    """Everything a job script needs besides the launch itself. ``kind`` names a batch system of sprite.schedulers."""

    kind: str
    nodes: int
    walltime: str
    job_name: str
    output_dir: str
    stem: str = ""  # the file name of its script and log without suffix; each submission takes a new one
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
    block_limits.check(block, site, schedulers.get(kind), given, complain_for)
    block_limits.check_queue(block, site.queues, complain_for)
    block["output_dir"] = _output_dir(given, doc, cwd, complain_for)
    default_name = re.sub(r"[^A-Za-z0-9_.-]", "-", Path(doc.source).name.split(".")[0])[:64].lstrip(".-")
    block.setdefault("job_name", default_name or "sprite")
    block["stem"] = block["job_name"]
    known = {f.name for f in fields(SchedulerBlock)}
    options = {key: value for key, value in block.items() if key not in known}
    return SchedulerBlock(kind=kind, options=options, **{key: value for key, value in block.items() if key in known})


def _output_dir(given: dict, doc: YamlDoc, cwd: str, complain_for: Callable) -> str:
    """The absolute output folder: the spec's output_dir (relative to the spec file) or ./sprite-jobs.

    Raises SpecError when the path cannot be written into a directive (a space in the current folder's path).
    """
    if "output_dir" in given:
        folder = os.path.join(os.path.dirname(os.path.abspath(doc.source)), given["output_dir"])
    else:
        folder = os.path.join(cwd, "sprite-jobs")
    folder = os.path.normpath(folder)
    if "%" in folder:
        # sbatch fills in %j, %u, %x... of --output (sbatch(1), "filename pattern"), and Slurm's PBS-style qsub
        # hands -o to it: the log would go to another folder than the one sprite names and checks.
        raise complain_for("output_dir")(
            f"the job's output folder {one_line(folder, 200)!r} holds %, which the batch system fills in "
            "(%j job id, %u user) in the log's path.", "a folder path without %")
    if not sv.TOKEN.fullmatch(folder):
        raise complain_for("output_dir")(
            f"the job's output folder {one_line(folder, 200)!r} (logs and the script) "
            f"{'' if 'output_dir' in given else 'is the default, ./sprite-jobs, and '}holds a space or other "
            "character a #PBS/#SBATCH directive cannot hold.",
            f"scheduler.output_dir set to a path of {sv.TOKEN_ALLOWED}")
    return folder


def check_account(block: SchedulerBlock, site, doc: YamlDoc) -> str | None:
    """None when the block names an account or the site needs none; a warning line when the site's profile says
    ``require_account: warn``. Raises SpecError naming the spec when it says ``refuse``."""
    if block.account or not site.require_account:
        return None
    what = f"no account is given, and {site.name} charges every job to one (qsub/sbatch -A)"
    if site.require_account == "refuse":
        raise doc.error(("scheduler", "account"), f"{what}; the scheduler would refuse the job.",
                        "your project's allocation name, e.g. account: MyProject")
    return (f"{doc.source}: scheduler.account: {what}; the job will be charged to your default project. "
            "Set scheduler.account to choose it.")
