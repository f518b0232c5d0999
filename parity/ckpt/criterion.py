"""The required checks of the checkpoint check, bit for bit. Pure: recorded digests and numbers in, checks out.

A role's result is ``{"ranks": [record, ...], "tensors": {...}}`` (ckpt_results). Restore checks compare, rank by
rank, the state captured after the restore with the state captured inside the save, one check per family:
trainables, optimizer (AdamW state and its devices), param_groups, scheduler, frozen, loop. Across world sizes
(reshard, export) the gathered full-value digests are compared, and the optimizer's device type. Continuation
checks: the first resumed step's loss equals the killed fit's (same world only), every step's LR equals the
uninterrupted fit's, the same rows are trained at every step (per rank; across world sizes, the step's rows of
all ranks together), and every step runs at the fit's loop position.
"""

from __future__ import annotations

from sprite.parity.criterion import check

FAMILIES = ("trainables", "optimizer", "param_groups", "scheduler", "frozen", "loop")


def _digests(saved: dict, restored: dict, key: str) -> str:
    a, b = saved.get(key), restored.get(key)
    if a is None or b is None:
        return f"{key} not recorded"
    differ = sorted(set(a) ^ set(b)) + sorted(n for n in a if n in b and a[n] != b[n])
    return f"{len(differ)} of {max(len(a), len(b))} differ (first: {differ[0]})" if differ else ""


def _devices(states: list[dict], full: bool) -> list:
    return sorted({d.split(":")[0] for d in states}) if full else states


def difference(family: str, saved: dict, restored: dict | None, full: bool) -> str:
    """'' when ``family`` of the restored state equals the saved one, else what differs."""
    if restored is None:
        return "nothing was restored"
    suffix = "_full" if full else ""
    if family in ("trainables", "frozen"):
        return _digests(saved, restored, family + suffix)
    if family == "optimizer":
        problem = _digests(saved, restored, "optimizer" + suffix)
        a, b = (_devices(s.get("optimizer_devices", []), full) for s in (saved, restored))
        return problem or ("" if a == b else f"state on {b}, saved on {a}")
    return "" if saved.get(family) == restored.get(family) else f"{restored.get(family)} != saved {saved.get(family)}"


def restore_checks(label: str, saved: list[dict], role: dict, full: bool) -> list[dict]:
    """One check per family: ``role`` restored on every rank what the save captured (``saved`` per rank; across
    world sizes only rank 0's full digests are used)."""
    out = []
    for family in FAMILIES:
        problems = [f"rank {r}: {why}" for r, record in enumerate(role["ranks"])
                    if (why := difference(family, saved[0 if full else r], record.get("restored"), full))]
        if not full and len(saved) != len(role["ranks"]):
            problems.append(f"{len(role['ranks'])} ranks restored, {len(saved)} saved")
        out.append(check(f"{label} restores {family}", family, "; ".join(problems) or "equal", "equal", not problems))
    return out + [changed_before_load(label, saved[0], role["ranks"][0])]


def changed_before_load(label: str, saved: dict, record: dict) -> dict:
    """Every frozen tensor differed from the saved one before the load, so only the checkpoint restored it."""
    before, reference = record.get("frozen_before_load") or {}, saved.get("frozen_full") or {}
    changed = sum(before.get(name) not in (None, digest) for name, digest in reference.items())
    return check(f"{label} every frozen tensor changed before the load", "frozen", f"{changed} of {len(reference)}",
                 "all", bool(reference) and changed == len(reference))


def _by_step(record: dict) -> dict[int, dict]:
    return {step["global_step"]: step for step in record["steps"]}


def _rows(result: dict, step: int, union: bool):
    per_rank = [_by_step(record).get(step, {}).get("rows") for record in result["ranks"]]
    return sorted(row for rows in per_rank for row in rows or []) if union else per_rank


def continuation_checks(label: str, role: dict, fit: dict, expected_steps: range, killed: dict | None) -> list[dict]:
    """LR, rows and loop position of every step against the uninterrupted ``fit``, and (``killed`` given, same
    world) the first resumed step's loss against the killed fit's, rank by rank."""
    union = len(role["ranks"]) != len(fit["ranks"])
    reference = _by_step(fit["ranks"][0])
    bad = {"lr": [], "rows": [], "loop": []}
    for rank, record in enumerate(role["ranks"]):
        steps = _by_step(record)
        if sorted(steps) != list(expected_steps):
            bad["loop"].append(f"rank {rank} ran steps {sorted(steps)}")
        for index, step in steps.items():
            ref = reference.get(index, {})
            if step["lr"] != ref.get("lr"):
                bad["lr"].append(f"rank {rank} step {index}: {step['lr']} != {ref.get('lr')}")
            if (step["epoch"], step["batch_idx"]) != (ref.get("epoch"), ref.get("batch_idx")):
                bad["loop"].append(f"rank {rank} step {index} at epoch {step['epoch']} batch {step['batch_idx']}")
    for index in expected_steps:
        if _rows(role, index, union) != _rows(fit, index, union):
            bad["rows"].append(f"step {index}")
    out = [check(f"{label} {name} of every step as in the fit", name, "; ".join(problems[:3]) or "equal", "equal",
                 not problems) for name, problems in bad.items()]
    if killed is not None:
        first = expected_steps[0]
        mine = [_by_step(record).get(first, {}).get("loss") for record in role["ranks"]]
        theirs = [_by_step(record).get(first, {}).get("loss") for record in killed["ranks"]]
        same = mine == theirs and None not in mine
        out.append(check(f"{label} first resumed loss equals the killed fit's", "loss",
                         "equal" if same else f"{mine} != {theirs}", "equal", same))
    return out
