"""One ``sprite run``: its folder, its settings, its audit records, and the plan of each attempt."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from sprite import contract
from sprite.contract import stacks
from sprite.integrity import audit
from sprite.recovery import hang, rundir
from sprite.spec import yamldoc
from sprite.spec import job as specmod
from sprite.launch import plan as planning
from sprite.errors import UsageError
from sprite.launch.plan import LaunchPlan
from sprite.recovery.watchdog import Limits, heartbeat_seconds


@dataclass
class Run:
    """The run folder, the flags and spec it plans from, its retry and watchdog settings, its attempts so far."""

    path: Path
    flags: dict
    spec_file: str | None
    environ: Mapping[str, str]
    retries: int
    limits: Limits | None
    script: str = ""
    keep_never: bool = False  # the user chose --resume never: relaunches start from scratch too
    allow_literal_secrets: bool = False  # as --allow-literal-secrets said (plan.assemble)
    requeue: bool = False  # ask the batch system to run the job again when the ranks stopped for preemption
    attempts: list = field(default_factory=list)

    @property
    def trail(self) -> Path:
        return self.path / rundir.AUDIT

    def record(self, kind: str, **fields) -> dict:
        return audit.append(self.trail, kind, **fields)

    def run_env(self, attempt: int, resume: str | None) -> dict:
        env = {contract.RUN_DIR: str(self.path), contract.ATTEMPT: str(attempt),
               contract.HEARTBEAT_SECONDS: f"{heartbeat_seconds(self.limits):g}"}
        if self.limits:  # the ranks' own stacks and collectives at a stall (issue 27)
            env[contract.STACKS_AFTER] = hang.after(self.limits).value()
            if not {stacks.RECORDER_BUFFER, stacks.RECORDER_OLD_BUFFER} & set(self.environ):
                env[stacks.RECORDER_BUFFER] = stacks.RECORDER_ENTRIES
        return {**env, contract.RESUME: resume} if resume else env

    def plan(self, attempt: int, flags: dict, resume: str | None = None) -> LaunchPlan:
        """Raises UsageError / SpecError as ``plan.plan_run`` does."""
        return planning.plan_run(flags, self.environ, self.spec_file, self.allow_literal_secrets,
                                 self.run_env(attempt, resume))

    def next_plan(self, plan: LaunchPlan, flags: dict, number: int, exclude: tuple) -> tuple[LaunchPlan, dict, str]:
        """The plan of attempt ``number`` with ``SPRITE_RESUME=auto`` (``never`` when the user chose it), without
        the hosts in ``exclude`` when the allocation has room for the same world; also its flags and where it runs."""
        resume = "never" if self.keep_never else "auto"
        if exclude:
            job, _ = planning.assemble(flags, self.spec_file, self.environ, self.allow_literal_secrets)
            narrowed = {**flags, "exclude": [*job.exclude, *exclude], "nodes": str(plan.world.nodes),
                        "spare_nodes": 0}
            try:
                return self.plan(number, narrowed, resume), narrowed, f"without {', '.join(exclude)}"
            except UsageError as err:
                where = f"on the same hosts ({', '.join(exclude)} cannot be left out: {err.what.rstrip('.')})"
                return self.plan(number, flags, resume), flags, where
        return self.plan(number, flags, resume), flags, "on the same hosts"


def limits_of(job) -> Limits | None:
    """The watchdog's limits from the job, None without a stall timeout. Raises UsageError for an allowance
    given without a stall timeout, or shorter than it."""
    specmod.check_allowances(job)
    if job.stall_timeout is None:
        return None
    return Limits.from_options(job.stall_timeout, job.first_step_timeout, job.save_timeout)


def said_never(flags: dict, spec_file: str | None) -> bool:
    """Whether the user chose ``--resume never`` (the flag, else the spec file), not merely left the default.

    Raises SpecError for an unreadable spec file.
    """
    if flags.get("resume") is not None:
        return flags["resume"] == "never"
    return bool(spec_file) and specmod.from_document(yamldoc.load(spec_file)).get("resume") == "never"
