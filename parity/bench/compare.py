"""`sprite bench compare OLD NEW`: did sprite's step time regress beyond a tolerance? For CI of user code.

OLD and NEW are bench.json files or the --out folders holding them. Only the same step can be compared (model,
LoRA or full, strategy, batch, seq, precision, attention, compile); world sizes measured in both are compared.
No torch.
"""

from __future__ import annotations

import pathlib

from sprite.errors import UsageError

SAME_STEP = ("model", "lora", "strategy", "batch", "seq", "precision", "attention", "compile")


def load(path: pathlib.Path) -> dict:
    """A bench report (read and checked by ``store.load_report``). Raises UsageError when ``path`` holds none."""
    from sprite.parity.bench import store

    return store.load_report(path)


def _step(report: dict) -> dict[int, float]:
    return {p["world"]: p["arms"]["sprite"]["step_s"]["median"] for p in report["points"] if "sprite" in p["arms"]}


def compare(old: dict, new: dict, tolerance: float) -> list[dict]:
    """One row per world size measured in both: old and new step time, their ratio, regressed or not.

    Raises UsageError when the two runs measured different steps or share no world size.
    """
    differ = [key for key in SAME_STEP if old["settings"].get(key) != new["settings"].get(key)]
    if differ:
        what = ", ".join(f"{k} {old['settings'].get(k)!r} vs {new['settings'].get(k)!r}" for k in differ)
        raise UsageError(f"The two benchmarks measured different steps ({what}).",
                         "A step time only compares with the same step.", "Rerun NEW with OLD's settings.")
    before, after = _step(old), _step(new)
    common = sorted(set(before) & set(after))
    if not common:
        raise UsageError(f"No world size has a sprite result in both runs (OLD {sorted(before)}, NEW {sorted(after)}).",
                         "The sweeps differ or an arm failed.", "Rerun NEW with a world size OLD measured.")
    return [{"world": w, "old_s": before[w], "new_s": after[w], "ratio": after[w] / before[w],
             "regressed": after[w] / before[w] > 1 + tolerance} for w in common]
