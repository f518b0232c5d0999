"""Site profiles: what sprite knows about a machine, as data in conf/<name>.yaml (never hostname checks).

A profile says which scheduler and MPI flavour the site has, how ranks bind to cores, the job defaults
(accelerator, ranks per node, launcher, environment) under ``job:``, and which variable names are secrets
(``secret_patterns:``, shell-style; default ``secret_env.DEFAULT_PATTERNS``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from sprite import scheduler_block, schedulers, secret_env
from sprite import spec as specmod
from sprite import values, yamldoc
from sprite.errors import UsageError

PROFILE_KEYS = (
    "name", "description", "scheduler", "mpi", "cpu_bind", "depth", "cpus_per_task", "job", "submit", "queues",
    "secret_patterns",
)


@dataclass(frozen=True)
class SiteProfile:
    """A validated site profile. ``job`` holds validated JobSpec defaults; ``submit``/``queues`` feed job scripts."""

    name: str
    description: str = ""
    scheduler: str = "none"
    mpi: str = "hydra"
    cpu_bind: str | None = None
    depth: int | None = None
    cpus_per_task: int | None = None
    job: dict = field(default_factory=dict)
    submit: dict = field(default_factory=dict)
    queues: dict = field(default_factory=dict)
    secret_patterns: tuple[str, ...] = secret_env.DEFAULT_PATTERNS
    source: str = ""


def available() -> list[str]:
    """Names of the profiles shipped in the installed package."""
    return sorted(p.name[:-5] for p in resources.files("sprite.conf").iterdir() if p.name.endswith(".yaml")
                  and "." not in p.name[:-5])


def _locate(name: str) -> Path:
    if name.endswith((".yaml", ".yml")) or "/" in name:
        return Path(name)
    path = resources.files("sprite.conf") / f"{name}.yaml"
    if not path.is_file():
        raise UsageError(
            f"Unknown site '{name}'.",
            "Site names are the profiles shipped in sprite's conf/ folder.",
            f"Use one of: {', '.join(available())}; or pass a path to your own profile YAML.",
        )
    return Path(str(path))


def load(name: str) -> SiteProfile:
    """Load and validate the profile ``name`` (a shipped name or a path). Raises UsageError / SpecError."""
    doc = yamldoc.load(_locate(name))
    for key in doc.data:
        if key not in PROFILE_KEYS:
            raise doc.error((key,), "is not a site profile key.", ", ".join(PROFILE_KEYS))
    data = dict(doc.data)
    if data.get("scheduler", "none") not in schedulers.names():
        raise doc.error(("scheduler",), f"{data['scheduler']!r} is not a known scheduler.",
                        ", ".join(schedulers.names()))
    if data.get("mpi", "hydra") not in specmod.MPI_FLAVOURS[1:]:
        raise doc.error(("mpi",), f"{data['mpi']!r} is not a known MPI flavour.", ", ".join(specmod.MPI_FLAVOURS[1:]))
    data["job"] = specmod.from_document(doc, ("job",)) if "job" in data else {}
    # submit: job-script defaults (scheduler_block.checks() keys); queues: {name: {min_nodes, max_nodes, max_walltime}}
    kind = data.get("scheduler", "none")
    kind = kind if schedulers.get(kind).submit_program else None
    data["submit"] = scheduler_block.check_block(doc, ("submit",), kind, site=True)
    data["queues"] = scheduler_block.check_queues(doc)
    if "secret_patterns" in data:
        data["secret_patterns"] = values.string_list(data["secret_patterns"], doc.complainer(())("secret_patterns"))
    data.setdefault("name", Path(doc.source).stem)
    return SiteProfile(**data, source=doc.source)
