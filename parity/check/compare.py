"""From a run directory's saved arm results to a verdict and its reports (what `sprite parity compare` does).

Reads only DIR (paths inside are relative), so a copy of DIR compares the same. No torch.
"""

from __future__ import annotations

import json
import pathlib

from sprite.parity import criterion, store
from sprite.parity.check import bf16
from sprite.parity.check import faults
from sprite.parity.check.invariants import invariants
from sprite.parity.settings import PRECISIONS, Settings


def load_settings(out: pathlib.Path) -> Settings:
    """The run's settings. Raises UsageError when DIR holds no parity run, ResultError when its run.json changed
    after the run (store.read_settings)."""
    found = store.read_settings(out, store.PARITY, "sprite parity")
    try:
        settings = Settings.from_dict(found)
        if settings.precision not in PRECISIONS:
            raise ValueError(f"precision {settings.precision!r}")
        return settings
    except (ValueError, TypeError) as err:
        raise store.ResultError(f"{out / store.SETTINGS} holds no parity settings ({err.__class__.__name__}: "
                                f"{str(err)[:120]}).", "It was written by another version of sprite.",
                                "Run the check again into a fresh --out.") from None


def _clean_arm(out: pathlib.Path, name: str) -> dict | None:
    """A clean arm, or None when it never started. Raises ResultError when it is incomplete or corrupted."""
    return store.load_arm(out / name) if (out / name).exists() else None


def compare_fp32(out: pathlib.Path, settings: Settings) -> dict:
    """The FP32 report. Raises ResultError for a corrupted or incomplete arm."""
    arms = {name: _clean_arm(out, name) for name in settings.arms}
    checks = criterion.fp32_checks(arms, settings.steps)
    verdict = "pass" if all(c["passed"] for c in checks) else "fail"
    per_step = {f"{name} vs ref": criterion.step_gaps(arms[name], arms["ref"]) for name in ("ddp", "fsdp")
                if arms.get(name) and arms.get("ref")}  # reported (pre-clip norm), never scored
    return {"precision": settings.precision, "settings": json.loads(settings.to_json()), "verdict": verdict,
            "checks": checks, "per_step": per_step}


def _fault_case(out, settings, fault, arm, split, digest, clean_ok) -> dict:
    try:
        data = store.load_arm(out / f"fault_{fault}" / arm)
    except store.ResultError as err:
        return faults.judge(fault, arm, None, clean_ok, str(err))
    checks = bf16.scored(arm, data, split) + invariants(arm, data, settings, digest, fault)
    return faults.judge(fault, arm, checks, clean_ok)


def compare_bf16(out: pathlib.Path, settings: Settings) -> tuple[dict, dict | None]:
    """The BF16 report and, when faults were requested, the faults report. Raises ResultError."""
    arms = {name: _clean_arm(out, name) for name in settings.arms}
    missing = [name for name, arm in arms.items() if arm is None]
    if missing:
        raise store.ResultError(f"BF16 arm(s) {', '.join(missing)} have no result in {out}.",
                                "The run was interrupted before those arms started.",
                                "Run the check again into a fresh --out directory.")
    digest = arms["ref"]["ranks"][0]["initial_digest"]
    inv = [c for name, arm in arms.items() for c in invariants(name, arm, settings, digest)]
    gate = bf16.scored("gate split_premul", arms["split_premul"], arms["split"])
    scores = bf16.scored("ddp", arms["ddp"], arms["split"]) + bf16.scored("fsdp", arms["fsdp"], arms["split"])
    verdict = bf16.verdict(inv, gate, scores)
    report = {"precision": settings.precision, "settings": json.loads(settings.to_json()), "verdict": verdict,
              "scored": scores, "gate": gate, "invariants": inv,
              "diagnostics": bf16.diagnostics(arms, settings.steps)}
    if not settings.faults:
        return report, None
    clean_ok = all(c["passed"] for c in inv + gate)
    results = [_fault_case(out, settings, f, a, arms["split"], digest, clean_ok) for f, a in faults.cases(settings.faults)]
    passed = all(case["status"] == "rejected" for case in results)
    return report, {"expected": list(settings.faults), "cases": results, "verdict": "pass" if passed else "fail"}


def compare(out: pathlib.Path, into: pathlib.Path | None = None) -> dict:
    """Recomputes every report of the run in ``out``, writes them into ``into`` (default ``out``, where the run
    writes its first reports; ``sprite parity compare`` passes a new folder) unless ``into`` is False, and returns
    them by file name.

    Raises UsageError (no run in ``out``) or ResultError (an arm result is incomplete or corrupted).
    """
    from sprite.parity.check.report import write_json

    settings = load_settings(out)
    if settings.precision == "32-true":
        reports = {"report.json": compare_fp32(out, settings)}
    else:
        main, fault_report = compare_bf16(out, settings)
        reports = {"bf16_report.json": main}
        if fault_report is not None:
            reports["faults_report.json"] = fault_report
    for name, report in reports.items() if into is not False else ():
        write_json((into or out) / name, report)
    return reports


def overall(reports: dict) -> str:
    """pass only if every report passes; else the main report's verdict (fail or void), or fail."""
    verdicts = [report["verdict"] for report in reports.values()]
    if all(v == "pass" for v in verdicts):
        return "pass"
    main = next(iter(reports.values()))["verdict"]
    return main if main != "pass" else "fail"
