"""The launches of one checkpoint check, what each needs first, and where results and checkpoints go. Pure.

Roles of every arm, each in its own process(es): an uninterrupted ``fit``, its ``twin``, a fit ``killed`` one step
past its epoch-1 checkpoint, a ``resume`` of that checkpoint (which then runs the arm's three fault cases, each a
fresh Trainer restoring the same checkpoint), and a ``reload`` of the checkpoint the resume writes. fsdp and
fsdp_file share one FSDP2 training: their fit and twin would be the same computation, and their killed fit writes
both formats at the same boundary, so those three launches are not repeated. ``reshard`` resumes the sharded
checkpoint at half the world size; ``export`` loads the ddp, fsdp_file and (consolidated) fsdp checkpoints on
one device. Paths are relative to the check's directory, so a copy of it compares the same.
"""

from __future__ import annotations

import dataclasses

from sprite.parity.ckpt.settings import ARMS, EXPORTED, FAULTS, CkptSettings

STRATEGY = {"single": "single", "ddp": "ddp", "fsdp": "fsdp", "fsdp_file": "fsdp"}


@dataclasses.dataclass(frozen=True)
class Launch:
    """One launch: ``key`` names it (and its log), ``after`` the launches whose checkpoints it reads."""

    key: str
    arm: str
    role: str
    strategy: str
    devices: int
    nodes: int
    after: tuple[str, ...] = ()

    @property
    def processes(self) -> int:
        return self.devices * self.nodes


def training_arm(arm: str) -> str:
    """The arm whose fit, twin and killed fit ``arm`` uses (fsdp_file trains as fsdp does)."""
    return "fsdp" if arm in ("fsdp", "fsdp_file") else arm


def result_dir(arm: str, role: str) -> str:
    """Where one role of one arm records (relative to the check's directory)."""
    return f"{arm}/{role}"


def fault_dir(arm: str, fault: str) -> str:
    return f"{arm}/fault_{fault}"


def checkpoint(arm: str, role: str, epoch: int) -> str:
    """The checkpoint ``role`` of ``arm`` writes at the end of ``epoch``: a DCP folder for fsdp, else a file."""
    name = f"checkpoints/{arm}-{role}-epoch{epoch}"
    return name if arm == "fsdp" else name + ".ckpt"


def consolidated(arm: str = "fsdp") -> str:
    """Where the export role writes the one-file consolidation of the sharded epoch-1 checkpoint."""
    return checkpoint(arm, "killed", 1) + ".consolidated.ckpt"


def launches(settings: CkptSettings) -> list[Launch]:
    """Every launch, in an order that respects ``after``."""
    world, (half_devices, half_nodes) = (settings.devices, settings.nodes), settings.half_world()
    out: list[Launch] = []
    for arm in ARMS:
        size = (1, 1) if arm == "single" else world
        trained = training_arm(arm)
        if trained == arm:
            out += [Launch(f"{arm}-{role}", arm, role, STRATEGY[arm], *size) for role in ("fit", "twin", "killed")]
        out.append(Launch(f"{arm}-resume", arm, "resume", STRATEGY[arm], *size, after=(f"{trained}-killed",)))
        out.append(Launch(f"{arm}-reload", arm, "reload", STRATEGY[arm], *size, after=(f"{arm}-resume",)))
    out.append(Launch("fsdp-reshard", "fsdp", "reshard", "fsdp", half_devices, half_nodes, after=("fsdp-killed",)))
    out.append(Launch("export", "export", "export", "single", 1, 1,
                      after=tuple(sorted({f"{training_arm(a)}-killed" for a in EXPORTED}))))
    return out


def expected_results(settings: CkptSettings) -> list[str]:
    """Every result folder a complete check holds (the criterion reports any that is missing)."""
    found = [result_dir(launch.arm, launch.role) for launch in launches(settings) if launch.role != "export"]
    found += [fault_dir(arm, fault) for arm in ARMS for fault in FAULTS]
    return found + [result_dir(arm, "export") for arm in EXPORTED]
