"""Reported, never scored: how far a resumed (or resharded, exported, twin) run ends up from the uninterrupted fit.

Loss and pre-clip norm gaps are the largest relative gaps over the compared steps (the loss of a step is the mean
of the ranks' losses, which is the global batch's mean as every rank holds as many rows); update and Adam moment
gaps are the largest per-tensor relative L2 gaps at the end: the update is measured from the fit's parameters at
the epoch-1 checkpoint. Exact zeros stay 0. Pure numpy.
"""

from __future__ import annotations

import math

import numpy as np

from sprite.parity.criterion import rel

KINDS = ("loss", "pre_norm", "update", "exp_avg", "exp_avg_sq")


def _steps(result: dict) -> dict[int, dict]:
    """global step -> {"loss": mean over ranks, "pre_norm": rank 0's}."""
    out = {}
    for step in result["ranks"][0]["steps"]:
        index = step["global_step"]
        losses = [s["loss"] for r in result["ranks"] for s in r["steps"] if s["global_step"] == index]
        out[index] = {"loss": sum(losses) / len(losses), "pre_norm": step.get("pre_norm")}
    return out


def _tensor_gap(result: dict, fit: dict, kind: str) -> float:
    ends = {k.split("/", 2)[2]: v for k, v in result["tensors"].items() if k.startswith(f"end/{kind}/")}
    refs = {k.split("/", 2)[2]: v for k, v in fit["tensors"].items() if k.startswith(f"end/{kind}/")}
    if not refs or set(ends) != set(refs):
        return math.inf
    worst = 0.0
    for name, ref in refs.items():
        diff = float(np.linalg.norm(ends[name].astype(np.float64) - ref.astype(np.float64)))
        base = ref.astype(np.float64)
        if kind == "param":
            base = base - fit["tensors"][f"epoch1/param/{name}"].astype(np.float64)
        scale = float(np.linalg.norm(base))
        worst = max(worst, diff / scale if scale else (0.0 if diff == 0 else math.inf))
    return worst


def gaps(result: dict, fit: dict) -> dict:
    """The five reported gaps of ``result`` against ``fit`` over the steps ``result`` ran."""
    mine, ref = _steps(result), _steps(fit)
    out = {}
    for kind in ("loss", "pre_norm"):
        values = [rel(step[kind], ref.get(index, {}).get(kind)) for index, step in mine.items()]
        out[kind] = max(values) if values else math.inf
    out["update"] = _tensor_gap(result, fit, "param")
    out["exp_avg"] = _tensor_gap(result, fit, "exp_avg")
    out["exp_avg_sq"] = _tensor_gap(result, fit, "exp_avg_sq")
    return out
