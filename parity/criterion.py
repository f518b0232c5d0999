"""Pure checks over recorded numbers: shared helpers and the FP32 parity rule.

An arm, as the criterion sees it, is ``{"ranks": [record, ...], "tensors": {key: np.ndarray}}`` (store.py).
A check is a dict: name, family (what kind of evidence it is), value, bound, passed. No torch, no I/O.

FP32 rule: against the single-device ref, every distributed arm must match the pre- and post-clip global
gradient norm of every step on every rank, and the 5-step update of all trainables, within 1e-4 relative;
leave every frozen tensor unchanged; have run on more than one device; and all three arms must be present.
"""

from __future__ import annotations

import math

import numpy as np

FP32_REL = 1e-4


def check(name: str, family: str, value, bound, passed: bool) -> dict:
    """One check result; a non-finite value never passes."""
    finite = not isinstance(value, float) or math.isfinite(value)
    return {"name": name, "family": family, "value": value, "bound": bound, "passed": bool(passed and finite)}


def rel(value, reference) -> float:
    """|value - reference| / |reference|; inf when either is missing or the reference is 0 and they differ."""
    if value is None or reference is None:
        return math.inf
    if reference == 0:
        return 0.0 if value == 0 else math.inf
    return abs(value - reference) / abs(reference)


def tensors(arm: dict, prefix: str) -> dict[str, np.ndarray]:
    """Rank 0's tensors under ``prefix`` ("init", "grad/0", "param/4"), keyed by trainable name, as float64."""
    start = prefix + "/"
    return {key[len(start):]: arm["tensors"][key].astype(np.float64) for key in arm["tensors"] if key.startswith(start)}


def update(arm: dict, step: int) -> dict[str, np.ndarray]:
    """Parameters after ``step`` minus the initial ones, per trainable tensor."""
    init, after = tensors(arm, "init"), tensors(arm, f"param/{step}")
    return {name: after[name] - init[name] for name in init if name in after}


def flat_rel(values: dict[str, np.ndarray], reference: dict[str, np.ndarray]) -> float:
    """Relative L2 difference over all tensors together; inf when the tensor sets differ."""
    if not reference or set(values) != set(reference):
        return math.inf
    diff = math.sqrt(sum(float(np.sum((values[n] - reference[n]) ** 2)) for n in reference))
    norm = math.sqrt(sum(float(np.sum(reference[n] ** 2)) for n in reference))
    return diff / norm if norm else (0.0 if diff == 0 else math.inf)


def step_values(arm: dict, key: str) -> list[list]:
    """``key`` of every step, per rank: [[rank0 step0, step1, ...], [rank1 ...], ...]."""
    return [[step.get(key) for step in record["steps"]] for record in arm["ranks"]]


def _norm_check(label: str, arm: dict, ref: dict, key: str) -> dict:
    reference = step_values(ref, key)[0]
    gaps = [rel(v, r) for rank in step_values(arm, key) for v, r in zip(rank, reference)]
    complete = all(len(rank) == len(reference) for rank in step_values(arm, key))
    worst = max(gaps) if gaps and complete else math.inf
    return check(f"{label} {key.replace('_', '-')} rel", key, worst, FP32_REL, worst <= FP32_REL)


def fp32_checks(arms: dict[str, dict | None], steps: int) -> list[dict]:
    """The FP32 rule for ``arms`` (name -> arm, None when it is missing). Returns the checks."""
    results = [check("arms present", "present", ", ".join(sorted(n for n, a in arms.items() if a is None)) or "all",
                     "ref, ddp, fsdp", all(arms.get(n) is not None for n in ("ref", "ddp", "fsdp")))]
    ref = arms.get("ref")
    for label in ("ddp", "fsdp"):
        arm = arms.get(label)
        if arm is None or ref is None:
            continue
        world = arm["ranks"][0]["meta"]["world"]
        results.append(check(f"{label} devices", "devices", world, "> 1", world > 1))
        results.append(_norm_check(label, arm, ref, "pre_norm"))
        results.append(_norm_check(label, arm, ref, "post_norm"))
        gap = flat_rel(update(arm, steps - 1), update(ref, steps - 1))
        results.append(check(f"{label} {steps}-step update rel L2", "update", gap, FP32_REL, gap <= FP32_REL))
        changed = sum(record["frozen_changed"] for record in arm["ranks"])
        total = arm["ranks"][0]["frozen_count"]
        results.append(check(f"{label} frozen changed", "frozen", f"{changed} of {total}", "0", changed == 0))
    return results


def step_gaps(arm: dict, ref: dict, key: str = "pre_norm") -> list[float]:
    """Per step, the largest relative gap of ``key`` over ``arm``'s ranks against ``ref``'s rank 0 (reported)."""
    reference = step_values(ref, key)[0]
    ranks = step_values(arm, key)
    return [max(rel(rank[s] if s < len(rank) else None, r) for rank in ranks) for s, r in enumerate(reference)]
