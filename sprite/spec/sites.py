"""Site profiles: what sprite knows about a machine, as data in conf/<name>.yaml (never hostname checks).

A profile says which scheduler and MPI flavour the site has, how ranks bind to cores, the job defaults
(accelerator, ranks per node, launcher, environment) under ``job:``, and which variable names are secrets
(``secret_patterns:``, shell-style; default ``secret_env.DEFAULT_PATTERNS``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Mapping

from sprite import schedulers
from sprite.spec import block_limits
from sprite.spec import scheduler_block
from sprite.spec import secrets as secret_env
from sprite.values import scheduler as sv
from sprite.spec import job as specmod
from sprite.values import grammar as v
from sprite.spec import yamldoc
from sprite.errors import SpecError, UsageError, one_line, show

PROFILE_KEYS = (
    "name", "description", "scheduler", "mpi", "cpu_bind", "depth", "cpus_per_task", "rendezvous_domain",
    "require_account", "limits", "job", "submit", "queues", "secret_patterns", "stage_root", "copper",
)
ACCOUNT_RULES = ("refuse", "warn")  # require_account: what sprite qsub/sbatch does with a spec that names none
SCALARS = {"name": sv.name, "description": v.string,
           "scheduler": lambda value, complain: v.choice(schedulers.names())(value, complain),  # the registry now
           "mpi": v.choice(specmod.MPI_FLAVOURS[1:]), "cpu_bind": sv.token, "depth": v.per_node,
           "cpus_per_task": v.per_node, "secret_patterns": v.text_list, "rendezvous_domain": sv.token,
           "require_account": v.choice(ACCOUNT_RULES),
           # --stage auto makes its folder here (a node-local SSD or ramdisk) instead of $TMPDIR
           "stage_root": lambda value, complain: _absolute(value, complain),
           # the site's Copper launch script (launch_copper.sh): --stage reads the archive through Copper's view
           "copper": v.string}
# Site facts that bound a job: nodes of the machine, ranks a node can hold (its hardware threads).
LIMITS = {"max_nodes": v.nodes, "max_ranks_per_node": v.ranks_per_node}


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
    rendezvous_domain: str | None = None  # MASTER_ADDR = <first host's short name>.<this domain>
    require_account: str | None = None  # "refuse" or "warn" when a submission names no account
    limits: dict = field(default_factory=dict)
    job: dict = field(default_factory=dict)
    submit: dict = field(default_factory=dict)
    queues: dict = field(default_factory=dict)
    secret_patterns: tuple[str, ...] = secret_env.DEFAULT_PATTERNS
    stage_root: str | None = None  # where --stage auto makes its folder on every node
    copper: str | None = None  # ALCF's Copper launch script, when the site has it
    source: str = ""
    origins: dict = field(default_factory=dict, compare=False, repr=False)  # job: key -> "file:line: key 'job.k'"


def _absolute(value, complain) -> str:
    text = v.string(value, complain)
    if not text.startswith("/"):
        raise complain(f"{show(value)} is not an absolute path.", "a node-local folder such as /local/scratch")
    return text


def available() -> list[str]:
    """Names of the profiles shipped in the installed package."""
    return sorted(p.name[:-5] for p in resources.files("sprite.conf").iterdir() if p.name.endswith(".yaml")
                  and "." not in p.name[:-5])


def _locate(name: str) -> Path:
    if name.endswith((".yaml", ".yml")) or "/" in name:
        return Path(name)
    path = resources.files("sprite.conf") / f"{name}.yaml" if sv.NAME.fullmatch(name) and len(name) <= 64 else None
    if path is None or not path.is_file():
        raise UsageError(
            f"Unknown site {show(name)}.",
            "Site names are the profiles shipped in sprite's conf/ folder.",
            f"Use one of: {', '.join(available())}; or pass a path to your own profile YAML.",
        )
    return Path(str(path))


def load(name: str) -> SiteProfile:
    """Load and validate the profile ``name`` (a shipped name or a path). Raises UsageError / SpecError."""
    doc = yamldoc.load(_locate(name))
    data = {}
    for key, value in doc.data.items():
        if key not in PROFILE_KEYS:
            raise doc.error((key,), "is not a site profile key.", ", ".join(PROFILE_KEYS))
        if key in SCALARS and value is not None:
            data[key] = SCALARS[key](value, doc.complainer()(key))
    data["limits"] = {}
    for key, value in doc.mapping(("limits",)).items():
        if key not in LIMITS:
            raise doc.error(("limits", key), "is not a site limit.", ", ".join(LIMITS))
        data["limits"][key] = LIMITS[key](value, doc.complainer(("limits",))(key))
    data["job"] = specmod.from_document(doc, ("job",))
    origins = specmod.origins(doc, data["job"], ("job",))
    # submit: job-script defaults (scheduler_block.checks() keys); queues: {name: {min_nodes, max_nodes, max_walltime}}
    kind = data.get("scheduler", "none")
    kind = kind if schedulers.get(kind).submit_program else None
    data["submit"] = scheduler_block.check_block(doc, ("submit",), kind, site=True)
    data["queues"] = block_limits.check_queues(doc)
    data.setdefault("name", Path(doc.source).stem)
    # a profile's patterns add to the defaults: replacing them dropped *_TOKEN and the rest without a word
    data["secret_patterns"] = tuple(dict.fromkeys((*secret_env.DEFAULT_PATTERNS, *data.get("secret_patterns", ()))))
    return SiteProfile(**data, source=doc.source, origins=origins)


def choose(flag_layer: dict, file_layer: dict, doc, environ: Mapping[str, str]) -> SiteProfile:
    """The profile named by --site, else the spec's site: (in ``doc``), else $SPRITE_SITE, else local.

    Raises SpecError naming the spec's line when its site: is unknown, UsageError otherwise.
    """
    name = flag_layer.get("site") or file_layer.get("site") or environ.get("SPRITE_SITE") or "local"
    try:
        return load(name)
    except SpecError:
        raise  # a fault inside the profile: it names the profile's own file and line
    except UsageError as err:
        if "site" in flag_layer:
            raise UsageError(f"Option --site: {err.what}", err.cause, err.fix) from None
        if "site" in file_layer:
            raise doc.error(("site",), str(err)) from None
        raise UsageError(f"SPRITE_SITE={one_line(name, 100)}: {err.what}", err.cause, err.fix) from None


def check_limits(job, site: SiteProfile) -> None:
    """Refuse a JobSpec asking for more nodes or ranks per node than the site's ``limits:`` allow.

    Raises UsageError naming where the value was written and the profile's limit.
    """
    for key, limit in (("nodes", "max_nodes"), ("devices", "max_ranks_per_node")):
        value, top = getattr(job, key), site.limits.get(limit)
        if value and top and value > top:
            raise UsageError(f"{job.blame(key)} is more than {site.name} allows ({limit}: {top}).",
                             f"The site profile {site.source} records {top} as the machine's limit.",
                             f"Ask for at most {top}.")
