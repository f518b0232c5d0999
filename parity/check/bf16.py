"""BF16 criterion v2: scored step-0 checks against split, the split_premul validity gate, verdict, diagnostics.

Scored (step 0 only, an arm against split): pre-clip global norm within 1e-3 relative on every rank; every
trainable tensor's gradient within 1e-3 * ||ref|| + 1e-12 * sqrt(numel); the step-0 update of all trainables
within 1e-3 relative L2; every tensor's step-0 update within the gradient bound plus 2 * eps_fp32 * ||initial||
(endpoint quantisation). The gate runs the same checks for split_premul against split. Pure numpy.
"""

from __future__ import annotations

import math

import numpy as np

from sprite.parity.criterion import check, flat_rel, rel, step_values, tensors, update

REL = 1e-3
ABS_FLOOR = 1e-12
EPS_FP32 = float(np.finfo(np.float32).eps)


def _tensor_bound(reference: np.ndarray, extra: float = 0.0) -> float:
    return REL * float(np.linalg.norm(reference)) + ABS_FLOOR * math.sqrt(reference.size) + extra


def per_tensor(values: dict, reference: dict, extras: dict | None = None) -> dict:
    """Per-tensor L2 gaps against their bounds: how many exceed, and the largest normalised gap."""
    over, worst = 0, 0.0
    for name, ref in reference.items():
        if name not in values:
            over, worst = over + 1, math.inf
            continue
        gap = float(np.linalg.norm(values[name] - ref))
        floor = ABS_FLOOR * math.sqrt(ref.size)
        worst = max(worst, gap / max(float(np.linalg.norm(ref)), floor))
        over += gap > _tensor_bound(ref, (extras or {}).get(name, 0.0))
    return {"over": over, "total": len(reference), "max_gap": worst}


def scored(label: str, arm: dict, split: dict) -> list[dict]:
    """The four scored step-0 checks of ``arm`` against ``split``."""
    reference = step_values(split, "pre_norm")[0][0]
    norm_gap = max(rel(rank[0] if rank else None, reference) for rank in step_values(arm, "pre_norm"))
    grads = per_tensor(tensors(arm, "grad/0"), tensors(split, "grad/0"))
    init = tensors(split, "init")
    quantisation = {name: 2 * EPS_FP32 * float(np.linalg.norm(value)) for name, value in init.items()}
    ups = per_tensor(update(arm, 0), update(split, 0), quantisation)
    up_gap = flat_rel(update(arm, 0), update(split, 0))
    return [
        check(f"{label} pre-clip norm rel (step 0, every rank)", "pre_norm", norm_gap, REL, norm_gap <= REL),
        check(f"{label} tensor gradients over bound (max gap {grads['max_gap']:.3g})", "gradients",
              f"{grads['over']}/{grads['total']}", "0", grads["over"] == 0 and grads["total"] > 0),
        check(f"{label} step-0 update rel L2", "update", up_gap, REL, up_gap <= REL),
        check(f"{label} tensor updates over bound (max gap {ups['max_gap']:.3g})", "tensor_updates",
              f"{ups['over']}/{ups['total']}", "0", ups["over"] == 0 and ups["total"] > 0),
    ]


def verdict(invariants: list[dict], gate: list[dict], scores: list[dict]) -> str:
    """fail if any invariant fails; else void if the gate fails; else pass only if every scored check passes."""
    if not invariants or not all(c["passed"] for c in invariants):
        return "fail"
    if not gate or not all(c["passed"] for c in gate):
        return "void"
    return "pass" if scores and all(c["passed"] for c in scores) else "fail"


def _gaps(arm: dict, ref: dict, step: int) -> dict:
    values, reference = tensors(arm, f"grad/{step}"), tensors(ref, f"grad/{step}")
    equal = [name for name in reference if name in values and np.array_equal(values[name], reference[name])]
    elements = sum(ref.size for ref in reference.values())
    same = sum(int(np.sum(values[n] == reference[n])) for n in reference if n in values)
    return {"max_gap": per_tensor(values, reference)["max_gap"], "bitwise_equal_tensors": len(equal),
            "equal_element_fraction": same / elements if elements else 0.0}


def diagnostics(arms: dict[str, dict], steps: int) -> dict:
    """Reported, never scored: per-step gradient gaps, 5-step updates, full-batch BF16 vs FP32."""
    pairs = [("ddp", "split"), ("fsdp", "split"), ("split_premul", "split"), ("ddp", "split_premul"),
             ("fsdp", "split_premul")]
    out: dict = {"per_step": {}, "five_step_update_rel": {}}
    for arm, ref in pairs:
        if arms.get(arm) and arms.get(ref):
            out["per_step"][f"{arm} vs {ref}"] = [_gaps(arms[arm], arms[ref], s) for s in range(steps)]
    for arm in ("ddp", "fsdp", "split_premul"):
        if arms.get(arm) and arms.get("split"):
            out["five_step_update_rel"][arm] = flat_rel(update(arms[arm], steps - 1), update(arms["split"], steps - 1))
    if arms.get("ref") and arms.get("ref32"):
        ref, ref32 = arms["ref"], arms["ref32"]
        out["bf16_vs_fp32"] = {
            "pre_norm_rel_step0": rel(step_values(ref, "pre_norm")[0][0], step_values(ref32, "pre_norm")[0][0]),
            "max_tensor_gradient_gap_step0": _gaps(ref, ref32, 0)["max_gap"],
            "update_rel_l2": flat_rel(update(ref, steps - 1), update(ref32, steps - 1)),
        }
    return out
