"""JobSpec: one validated description of a job, merged from a site profile, a YAML spec file and CLI flags.

Later layers win: site profile ``job:`` defaults, then the spec file, then CLI flags. Every value is checked
where it was written, so a rejection names its file and line (or its flag) and what is allowed.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Callable

from sprite import contract
from sprite.errors import Complain, UsageError
from sprite.yamlsrc import YamlDoc

ACCELERATORS = contract.ACCELERATORS
STRATEGIES = contract.STRATEGIES
LAUNCHERS = ("auto", "mpiexec", "srun", "torchrun", "local")
MPI_FLAVOURS = ("auto", "pals", "hydra", "openmpi")
PRECISIONS = (
    "auto", "32-true", "32", "bf16-mixed", "bf16", "16-mixed", "16", "bf16-true", "16-true", "64-true", "64",
)


@dataclass(frozen=True)
class JobSpec:
    """What to launch and how. ``None`` means "decide from the site profile or the allocation"."""

    script: str | None = None
    args: tuple[str, ...] = ()
    nodes: int | None = None
    devices: int | None = None
    accelerator: str = "auto"
    strategy: str = "auto"
    precision: str = "auto"
    launcher: str = "auto"
    mpi: str = "auto"
    site: str = "local"
    env: dict = field(default_factory=dict)
    exclude: tuple[str, ...] = ()
    master_port: int | None = None
    scheduler: dict = field(default_factory=dict)
    checks: str = "on"  # the runtime's fit-start contract checks: on (warn), off, strict (every warning an error)


FIELD_NAMES = tuple(f.name for f in fields(JobSpec))


def _choice(options: tuple[str, ...]):
    def check(value: Any, complain: Complain) -> str:
        text = str(value) if isinstance(value, (str, int)) and not isinstance(value, bool) else None
        if text not in options:
            raise complain(f"{value!r} is not a valid choice.", ", ".join(options))
        return text
    return check


def _positive_int(value: Any, complain: Complain) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)) or not str(value).strip().isdigit():
        raise complain(f"{value!r} is not a whole number.", "an integer of at least 1, e.g. 2")
    if int(value) < 1:
        raise complain(f"{value!r} is less than 1.", "an integer of at least 1")
    return int(value)


def _port(value: Any, complain: Complain) -> int:
    port = _positive_int(value, complain)
    if not 1024 <= port <= 65535:
        raise complain(f"{port} is outside the unprivileged port range.", "1024-65535")
    return port


def _checks(value: Any, complain: Complain) -> str:
    # YAML 1.1 reads a bare `checks: on` / `checks: off` as a boolean (yaml.safe_load).
    if isinstance(value, bool):
        return "on" if value else "off"
    return _choice(contract.CHECK_MODES)(value, complain)


def _string(value: Any, complain: Complain) -> str:
    if not isinstance(value, str) or not value:
        raise complain(f"{value!r} is not a non-empty string.", "a path or name in quotes if need be")
    return value


def _string_list(value: Any, complain: Complain) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [part for part in value.split(",") if part]
    if not isinstance(value, list) or not all(isinstance(v, (str, int, float)) for v in value):
        raise complain(f"{value!r} is not a list of strings.", "a YAML list such as [a, b]")
    return tuple(str(v) for v in value)


def _env(value: Any, complain: Complain) -> dict:
    if not isinstance(value, dict):
        raise complain(f"{value!r} is not a mapping.", "NAME: value pairs")
    out = {}
    for name, val in value.items():
        if not isinstance(name, str) or not name.replace("_", "a").isalnum() or name[0].isdigit():
            raise complain(f"{name!r} is not a valid environment variable name.", "letters, digits and _")
        if isinstance(val, (dict, list)) or val is None:
            raise complain(f"{name}={val!r} is not a scalar value.", "a string or number")
        out[name] = str(val).lower() if isinstance(val, bool) else str(val)
    return out


def _mapping(value: Any, complain: Complain) -> dict:
    if not isinstance(value, dict):
        raise complain(f"{value!r} is not a mapping.", "a block of key: value lines")
    return dict(value)


CHECKS: dict[str, Callable[[Any, Complain], Any]] = {
    "script": _string, "args": _string_list, "nodes": _positive_int, "devices": _positive_int,
    "accelerator": _choice(ACCELERATORS), "strategy": _choice(STRATEGIES), "precision": _choice(PRECISIONS),
    "launcher": _choice(LAUNCHERS), "mpi": _choice(MPI_FLAVOURS), "site": _string, "env": _env,
    "exclude": _string_list, "master_port": _port, "scheduler": _mapping, "checks": _checks,
}
assert set(CHECKS) == set(FIELD_NAMES)


def check_values(values: dict, complain_for: Callable[[str], Complain]) -> dict:
    """Validate raw ``values`` field by field; ``complain_for(key)`` builds the error for that key.

    Raises whatever ``complain_for`` builds (a UsageError subclass) for an unknown key or a bad value.
    """
    out = {}
    for key, value in values.items():
        if key not in CHECKS:
            raise complain_for(key)("is not a job spec key.", ", ".join(FIELD_NAMES))
        out[key] = CHECKS[key](value, complain_for(key))
    return out


def from_document(doc: YamlDoc, section: tuple[str, ...] = ()) -> dict:
    """Validated fields of a spec file (or of a profile's ``job:`` block, given ``section``).

    Relative ``script`` paths resolve against the file's folder. Raises SpecError naming file, line and key.
    """
    checked = check_values(doc.mapping(section), doc.complainer(section))
    if "script" in checked:
        checked["script"] = str((Path(doc.source).parent / checked["script"]).resolve())
    return checked


def from_flags(flags: dict) -> dict:
    """Validated fields given on the command line (``None`` values are flags not given). Raises UsageError."""
    given = {key: value for key, value in flags.items() if value is not None}

    def complain_for(key: str) -> Complain:
        flag = "--" + key.replace("_", "-")
        return lambda what, allowed="": UsageError(f"Option {flag}: {what}", "", f"Allowed: {allowed}." if allowed else "")

    return check_values(given, complain_for)


def merge(*layers: dict) -> JobSpec:
    """Build a JobSpec from validated layers, later layers winning; ``env`` and ``scheduler`` merge by key."""
    spec = JobSpec()
    for layer in layers:
        changes = dict(layer)
        for key in ("env", "scheduler"):
            if key in changes:
                changes[key] = {**getattr(spec, key), **changes[key]}
        spec = replace(spec, **changes)
    return spec
