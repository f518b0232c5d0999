"""What one `sprite preflight` checks and how strictly: light on purpose (no torch), since the command line, the
ranks and the criterion all read it. The launcher writes it once as ``settings.json`` in the output folder; every
rank reads that file, so every rank of a launch follows the same plan.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib

from sprite.errors import UsageError

FAULT_KINDS = ("wrong-result", "slow", "no-device", "hang")
SETTINGS_FILE = "settings.json"
# A rank's records under ranks/: before the rendezvous, after the all-reduces, and its second timed window.
RECORD_SUFFIXES = {"compute": ".compute.json", "final": ".json", "again": ".again.json"}
# Reference-computation precisions by the name a Trainer precision starts with; fp32 is always checked.
PRECISION_OF = {"bf16": "bf16", "16": "fp16", "32": "fp32", "64": "fp32"}


@dataclasses.dataclass(frozen=True)
class PreflightSettings:
    """One preflight. ``faults`` maps a host to a negative control (FAULT_KINDS) its local rank 0 injects."""

    accelerator: str = "cpu"
    precisions: tuple[str, ...] = ("fp32", "bf16")
    size: int = 512  # rows and columns of the reference matmuls
    repeats: int = 9  # timed repetitions of the reference computation (the fastest counts)
    slow_factor: float = 2.0  # a rank slower than the other ranks' median by more than this fails
    expected_devices: int = 1  # devices every rank must see (the site profile's promise)
    allreduce_mib: float = 4.0  # payload of the timed all-reduces
    collective_timeout: float = 20.0  # seconds an all-reduce (and the making of its group) may take
    rendezvous_timeout: float = 600.0  # seconds the ranks may wait for each other to start (start-up spread)
    faults: tuple[tuple[str, str], ...] = ()

    def fault_for(self, host: str) -> str | None:
        return next((kind for where, kind in self.faults if where == host), None)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=1, sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict) -> PreflightSettings:
        known = {field.name for field in dataclasses.fields(cls)}
        values = {key: value for key, value in data.items() if key in known}
        values["precisions"] = tuple(values.get("precisions", cls.precisions))
        values["faults"] = tuple(tuple(pair) for pair in values.get("faults", ()))
        return cls(**values)

    @classmethod
    def load(cls, folder: pathlib.Path) -> PreflightSettings:
        return cls.from_dict(json.loads((folder / SETTINGS_FILE).read_text()))


def precisions_for(trainer_precision: str) -> tuple[str, ...]:
    """The reference computation's precisions for a job's precision: fp32 always, plus the job's own half
    precision; ``auto`` (the script decides) checks fp32 and bf16, the precisions these sites train in."""
    if trainer_precision in ("auto", ""):
        return ("fp32", "bf16")
    extra = next((kind for prefix, kind in PRECISION_OF.items() if trainer_precision.startswith(prefix)), "fp32")
    return ("fp32",) if extra == "fp32" else ("fp32", extra)


def parse_faults(values: list[str] | None, hosts: tuple[str, ...], option: str = "--fault") -> tuple:
    """``HOST:KIND`` options as ((host, kind), ...). Raises UsageError for a malformed one, an unknown kind, a
    host the launch does not use, or a host given twice."""
    found: dict[str, str] = {}
    for text in values or ():
        host, sep, kind = text.rpartition(":")
        if not sep or not host:
            raise UsageError(f"{option} {text!r} is not HOST:KIND.", "A negative control names a host and a fault.",
                             f"Write it as {option} HOST:KIND with KIND one of {', '.join(FAULT_KINDS)}.")
        if kind not in FAULT_KINDS:
            raise UsageError(f"{option} {text!r}: no fault kind {kind!r}.", "", f"Use one of {', '.join(FAULT_KINDS)}.")
        if host not in hosts:
            raise UsageError(f"{option} {text!r}: host {host!r} is not one of this preflight's hosts.",
                             "The host is misspelled, or excluded from the launch.",
                             f"Name one of: {', '.join(hosts[:8])}{' ...' if len(hosts) > 8 else ''}.")
        if host in found:
            raise UsageError(f"{option} names host {host!r} twice.", "Each host takes one fault.",
                             "Give one fault per host.")
        found[host] = kind
    return tuple(found.items())
