"""The batch systems sprite knows, by the name a site profile gives them. The one registry of their names.

``detect(environ)`` picks the system a process runs under (the first that claims it, PBS before Slurm, then no
scheduler); ``get(name)`` the one a site profile or an Allocation names.
"""

from __future__ import annotations

from typing import Callable, Mapping

from sprite.errors import UsageError, one_line, show
from sprite.schedulers.allocation import Allocation, read_text
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
        raise UsageError(f"{show(name)} is not a scheduler sprite knows.", "A typo in --scheduler or a site profile.",
                         f"Use one of: {', '.join(REGISTRY)}.") from None


def detect(environ: Mapping[str, str]) -> Scheduler:
    """The system whose job this process runs in (NONE outside any job)."""
    return next(s for s in REGISTRY.values() if s.detect(environ))


def discover(environ: Mapping[str, str], read: Callable[[str], str] = read_text,
             hostname: str = "localhost") -> Allocation:
    """The allocation this process runs in: PBS first, then Slurm, else this machine alone."""
    return detect(environ).allocation(environ, read, hostname)


def detection_notes(environ: Mapping[str, str]) -> list[str]:
    """A note when the variables of several batch systems are set: which one ``detect`` chose, and why."""
    claims = [s for s in REGISTRY.values() if s is not NONE and s.detect(environ)]
    if len(claims) < 2:
        return []
    shown = " and ".join(f"{s.label} ({s.job_variable}={one_line(environ.get(s.job_variable, ''), 40)})"
                         for s in claims)
    return [f"note: the variables of {shown} are all set; {claims[0].label} won (sprite checks "
            f"{', '.join(s.label for s in claims)} in that order). Unset the other's variables if that is wrong."]


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
