"""Negative controls: which arms each fault runs on, what it breaks, and how a case counts as rejected.

A case (fault, arm) is rejected when its result is complete, the clean run's invariants and validity gate
pass, and at least one failed check belongs to a family attributable to the fault. A case without a
complete result is "not executed". Any case not rejected fails the run. Pure: no torch.
"""

from __future__ import annotations

from sprite.errors import UsageError

# fault -> (arms it runs on, check families that can only fail because of it, what it does)
FAULTS = {
    "missing-rank": (("ddp", "fsdp"), {"pre_norm", "gradients"}, "the last rank's loss is multiplied by 0"),
    "wrong-scale": (("ddp", "fsdp"), {"pre_norm", "gradients"}, "every rank's loss is multiplied by N"),
    "fp32-backbone": (("ddp",), {"dtype"}, "the backbone forward runs without autocast"),
    "local-adapter": (("ddp",), {"synchronized"}, "one LoRA tensor keeps its local gradient"),
    "scale-grad": (("ddp",), {"pre_norm", "gradients"}, "gradients are multiplied by N after synchronisation"),
    "skip-update": (("ddp",), {"synchronized"}, "ranks other than 0 skip the last update"),
}


def validate(faults: list[str], precision: str, world: int) -> tuple[str, ...]:
    """Returns the requested faults without duplicates, in order.

    Raises UsageError for an unknown fault, a fault with --precision 32-true, or a world of one rank.
    """
    unknown = [f for f in faults if f not in FAULTS]
    if unknown:
        raise UsageError(f"Unknown --fault {', '.join(unknown)}.", "Only the listed negative controls exist.",
                         f"Use one or more of: {', '.join(FAULTS)}.")
    if faults and precision != "bf16-mixed":
        raise UsageError("--fault was given with --precision 32-true.",
                         "Negative controls are scored by the BF16 criterion v2.",
                         "Add --precision bf16-mixed, or drop --fault.")
    if faults and world < 2:
        raise UsageError("--fault needs at least 2 ranks.", "Every control breaks cross-rank averaging.",
                         "Pass --devices 2 or more.")
    return tuple(dict.fromkeys(faults))


def cases(faults: tuple[str, ...]) -> list[tuple[str, str]]:
    """(fault, arm) pairs to run, in order."""
    return [(fault, arm) for fault in faults for arm in FAULTS[fault][0]]


def judge(fault: str, arm: str, checks: list[dict] | None, clean_ok: bool, error: str = "") -> dict:
    """The status of one case from its checks (None when it has no complete result)."""
    case = {"fault": fault, "arm": arm, "does": FAULTS[fault][2]}
    if checks is None:
        return {**case, "status": "not executed", "evidence": [], "reason": error or "no complete result"}
    failed = sorted({c["family"] for c in checks if not c["passed"]})
    evidence = [family for family in failed if family in FAULTS[fault][1]]
    if not clean_ok:
        status, reason = "not executed", "the clean run's invariants or validity gate failed: nothing to compare to"
    elif evidence:
        status, reason = "rejected", "failed: " + ", ".join(evidence)
    else:
        status, reason = "not rejected", "no check attributable to the fault failed (failed: " + (
            ", ".join(failed) or "none") + ")"
    return {**case, "status": status, "evidence": evidence, "failed_families": failed, "reason": reason,
            "checks": checks}
