"""From a check directory's sealed results and checkpoints to the verdict (what `sprite ckpt-check compare` does).

Reads only DIR, through relative paths, so a copy of DIR compares the same; every result and checkpoint is
verified against its manifest first, so an altered one fails the check with a reason naming it. No torch.
"""

from __future__ import annotations

import json
import os
import pathlib

from sprite import integrity
from sprite.parity import store
from sprite.parity.ckpt import results as ckpt_results
from sprite.parity.ckpt.gaps import gaps
from sprite.parity.ckpt.judge import arm_checks, fault_case, moved, moved_checks
from sprite.parity.ckpt.roles import checkpoint, consolidated, expected_results, launches, result_dir, training_arm
from sprite.parity.ckpt.settings import ARMS, FAULTS, CkptSettings
from sprite.parity.store import ResultError


def load_settings(out: pathlib.Path) -> CkptSettings:
    """The check's settings. Raises UsageError when DIR holds no check; ResultError when run.json was altered."""
    return CkptSettings.from_dict(store.read_settings(out, store.CKPT_CHECK, "sprite ckpt-check"))


def launch_outcome(out: pathlib.Path, key: str) -> str:
    """Why a launch left no result: its recorded outcome, or that it never started."""
    path = out / "launches" / f"{key}.json"
    if not path.is_file():
        return f"not executed: launch {key} never started"
    try:
        record = json.loads(path.read_text())
        if not isinstance(record, dict):
            raise TypeError(f"a {type(record).__name__}, not an object")
        if record.get("timed_out"):
            return f"not executed: timed out after {float(record['limit_s']):g} s"
    except (OSError, ValueError, TypeError, KeyError) as err:  # the launch records are not sealed
        return f"not executed: launch {key}'s record {path.name} cannot be read ({type(err).__name__}: {err})"
    if record.get("cancelled"):
        return f"not executed: launch {key} was stopped when the check ended (a time-out or an interrupt)"
    if record.get("skipped"):
        return f"not executed: launch {key} was skipped: {record['skipped']}"
    return f"not executed: launch {key} exited with code {record.get('exit_code')} (see logs/{key}.log)"


def _launch_of(rel: str) -> str:
    arm, role = rel.split("/")
    if role == "export":
        return "export"
    if role.startswith("fault_"):
        return f"{arm}-resume"
    return f"{training_arm(arm) if role in ('fit', 'twin', 'killed') else arm}-{role}"


def load_results(out: pathlib.Path, settings: CkptSettings) -> tuple[dict, dict]:
    """(rel -> result or None, rel -> why it is None) for every result a complete check holds."""
    results, errors = {}, {}
    for rel in expected_results(settings):
        try:
            results[rel] = ckpt_results.load(out, rel)
        except (ResultError, OSError, ValueError, KeyError) as err:
            results[rel] = None
            exists = os.path.lexists(out / rel)
            errors[rel] = (str(err) if exists else launch_outcome(out, _launch_of(rel)))
    return results, errors


def verify_checkpoints(out: pathlib.Path) -> dict:
    """rel -> {"valid", "reason", "manifest_sha256"} for every checkpoint a complete check writes."""
    names = [checkpoint(arm, role, epoch) for arm in ARMS for role, epoch in (("killed", 1), ("resume", 2))]
    info = {}
    for rel in names + [consolidated()]:
        verdict = integrity.verify(out / rel)
        manifest = integrity.manifest_path(out / rel)
        sha = integrity.sha256_file(manifest) if manifest.is_file() else None
        reason = verdict.reason.replace(f"{out}{os.sep}", "")  # relative: the same text for a copy of DIR
        info[rel] = {"valid": verdict.valid, "reason": reason, "manifest_sha256": sha}
    return info


def _gap_rows(results: dict, settings: CkptSettings) -> list[dict]:
    rows = []
    for label, rel, _, _ in [(f"{a} resume", result_dir(a, "resume"), 0, 0) for a in ARMS] + moved(settings):
        arm = rel.split("/")[0]
        fit = results.get(result_dir(training_arm(arm), "fit"))
        if results.get(rel) and fit:
            rows.append({"arm": label.replace(" resume", ""), "against": f"{training_arm(arm)} fit",
                         **gaps(results[rel], fit)})
    for arm in ("single", "ddp", "fsdp"):
        if results.get(result_dir(arm, "twin")) and results.get(result_dir(arm, "fit")):
            rows.append({"arm": f"{arm} twin", "against": f"{arm} fit",
                         **gaps(results[result_dir(arm, "twin")], results[result_dir(arm, "fit")])})
    return rows


def compare(out: pathlib.Path) -> dict:
    """The report of the check in ``out``. Raises UsageError (no check there) or ResultError (run.json altered)."""
    settings = load_settings(out)
    results, errors = load_results(out, settings)
    ckpts, get = verify_checkpoints(out), results.get
    checks, clean = [], {}
    for arm in ARMS:
        own = arm_checks(arm, get, ckpts, errors, settings)
        clean[arm] = all(c["passed"] for c in own)
        checks += [{**c, "arm": arm} for c in own]
    for label, rel, ckpt, world in moved(settings):
        checks += [{**c, "arm": label} for c in moved_checks(label, rel, ckpt, get, ckpts, errors, world, settings)]
    cases = [fault_case(arm, fault, get, errors, clean[arm], settings) for arm in ARMS for fault in FAULTS]
    passed = all(c["passed"] for c in checks) and all(case["status"] == "rejected" for case in cases)
    return {"kind": "sprite ckpt-check", "verdict": "pass" if passed else "fail",
            "settings": json.loads(settings.to_json()), "checks": checks, "faults": cases,
            "gaps": _gap_rows(results, settings), "missing_results": errors,
            "launches": [launch.key for launch in launches(settings)]}
