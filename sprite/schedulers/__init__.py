"""The batch systems sprite knows, by the name a site profile gives them. The one registry of their names.

``detect(environ)`` picks the system a process runs under (the first that claims it, PBS before Slurm, then no
scheduler); ``get(name)`` the one a site profile or an Allocation names.
"""

from __future__ import annotations

from typing import Mapping

from sprite.errors import UsageError
from sprite.schedulers.base import Scheduler
from sprite.schedulers.local import NoScheduler
from sprite.schedulers.pbs import PBS
from sprite.schedulers.slurm import Slurm

# Detection order: a PBS job that also inherited Slurm variables is a PBS job (sprite env says which won);
# "none" claims every environment, so it stays last and a new system goes before it.
REGISTRY: dict[str, Scheduler] = {"pbs": PBS(), "slurm": Slurm(), "none": NoScheduler()}
NONE = REGISTRY["none"]
# Which client on PATH reveals the system: Slurm first, since Slurm's PBS-compatible qstat may sit beside squeue.
CLIENT_PROBE_ORDER = ("slurm", "pbs")


def names() -> tuple[str, ...]:
    """Every scheduler name a site profile may give, "none" included."""
    return tuple(REGISTRY)


def batch() -> tuple[Scheduler, ...]:
    """The systems that take job submissions (qsub, sbatch, ...)."""
    return tuple(s for s in REGISTRY.values() if s.submit_program)


def get(name: str) -> Scheduler:
    """The scheduler called ``name``. Raises UsageError for an unknown name."""
    try:
        return REGISTRY[name]
    except KeyError:
        raise UsageError(f"{name!r} is not a scheduler sprite knows.", "A typo in --scheduler or a site profile.",
                         f"Use one of: {', '.join(REGISTRY)}.") from None


def detect(environ: Mapping[str, str]) -> Scheduler:
    """The system whose job this process runs in (NONE outside any job)."""
    return next(s for s in REGISTRY.values() if s.detect(environ))


def by_submit_program(program: str) -> Scheduler:
    """The system whose submit command is ``program`` (qsub -> PBS). Raises UsageError if none."""
    for scheduler in batch():
        if scheduler.submit_program == program:
            return scheduler
    raise UsageError(f"No scheduler submits with {program!r}.", "", f"Use one of: "
                     f"{', '.join(s.submit_program for s in batch())}.")


def by_client_probe() -> tuple[Scheduler, ...]:
    """The batch systems in the order their clients should be looked for on PATH."""
    return tuple(REGISTRY[name] for name in CLIENT_PROBE_ORDER)
