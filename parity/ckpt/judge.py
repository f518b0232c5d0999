"""Every required check of a checkpoint check, and the status of every fault case. Pure: results in, checks out.

``get(rel)`` returns a loaded role result or None (missing, unsealed or altered: the caller keeps the reason);
``ckpts`` maps a checkpoint's relative path to ``{"valid", "reason", "manifest_sha256"}`` as verified now.
A fault case is rejected when the clean arm passed, at least one check of a family attributable to the fault
failed, and no other family did; a case without a valid result is "not executed". Both fail the run unless
rejected.
"""

from __future__ import annotations

from sprite.parity.ckpt.criterion import continuation_checks, restore_checks
from sprite.parity.ckpt.roles import checkpoint, consolidated, fault_dir, result_dir, training_arm
from sprite.parity.ckpt.settings import EXPORTED, FAULTS, CkptSettings
from sprite.parity.criterion import check


def _saved(writer: dict, rel: str) -> list[dict]:
    return [record["saves"].get(rel, {}).get("state", {}) for record in writer["ranks"]]


def integrity_check(label: str, rel: str, info: dict | None, writer: dict | None, loaders: list) -> dict:
    """The checkpoint verifies now, and its manifest is the one its writer sealed and every loader verified."""
    shas = {record["meta"].get("loaded", {}).get("manifest_sha256") for loader in loaders if loader
            for record in loader["ranks"]}
    if writer is not None:
        shas.add(writer["ranks"][0]["saves"].get(rel, {}).get("manifest_sha256"))
    info = info or {"valid": False, "reason": f"{rel} was never written"}
    problem = "" if info["valid"] else info["reason"]
    if not problem and shas != {info["manifest_sha256"]}:
        problem = "its manifest is not the one the roles wrote and loaded"
    return check(f"{label} {rel} sealed and unchanged", "integrity", problem or "valid", "valid", not problem)


def present_check(label: str, wanted: dict, errors: dict) -> dict:
    """All results in ``wanted`` (rel -> result or None) are there; the value names the missing and why."""
    missing = [f"{rel}: {errors.get(rel, 'missing')}" for rel, result in wanted.items() if result is None]
    return check(f"{label} results complete", "present", "; ".join(missing) or "all", "all", not missing)


def arm_checks(arm: str, get, ckpts: dict, errors: dict, s: CkptSettings) -> list[dict]:
    """The required checks of one arm: kill point, twin, resume, reload and checkpoint integrity."""
    trained, spe = training_arm(arm), s.steps_per_epoch
    roles = {role: get(result_dir(trained if role in ("fit", "twin", "killed") else arm, role))
             for role in ("fit", "twin", "killed", "resume", "reload")}
    out = [present_check(arm, {result_dir(trained if r in ("fit", "twin", "killed") else arm, r): v
                               for r, v in roles.items()}, errors)]
    fit, twin, killed, resume, reload = roles.values()
    source, final = checkpoint(arm, "killed", 1), checkpoint(arm, "resume", 2)
    if killed:
        kill_ok = all(len(r["steps"]) == spe + 1 and r["saves"].get(source, {}).get("state", {}).get("loop")
                      == {"global_step": spe, "next_epoch": 1} for r in killed["ranks"])
        out.append(check(f"{arm} killed one step past its epoch-1 checkpoint", "kill",
                         [len(r["steps"]) for r in killed["ranks"]], spe + 1, kill_ok))
    if fit and killed:
        out += continuation_checks(f"{arm} killed", killed, fit, range(spe + 1), None)
    if fit and twin:
        out += continuation_checks(f"{arm} twin", twin, fit, range(s.steps), None)
    if killed and resume:
        out += restore_checks(f"{arm} resume", _saved(killed, source), resume, full=False)
    if fit and killed and resume:
        out += continuation_checks(f"{arm} resume", resume, fit, range(spe, s.steps), killed)
    if resume and reload:
        out += restore_checks(f"{arm} reload", _saved(resume, final), reload, full=False)
    faults = [get(fault_dir(arm, f)) for f in FAULTS]
    exported = [get(result_dir(arm, "export"))] if arm in ("ddp", "fsdp_file") else []
    out.append(integrity_check(arm, source, ckpts.get(source), killed, [resume, *faults, *exported]))
    out.append(integrity_check(arm, final, ckpts.get(final), resume, [reload]))
    return out


def moved_checks(label: str, role: dict | None, rel: str, get, ckpts: dict, errors: dict, world: int,
                 s: CkptSettings) -> list[dict]:
    """Reshard or export: a checkpoint restored on another world size, then trained to the end."""
    result = get(role)
    arm = role.split("/")[0]
    fit, killed = get(result_dir(training_arm(arm), "fit")), get(result_dir(training_arm(arm), "killed"))
    out = [present_check(label, {role: result, result_dir(training_arm(arm), "fit"): fit,
                                 result_dir(training_arm(arm), "killed"): killed}, errors)]
    if result is None or fit is None or killed is None:
        return out
    ranks = len(result["ranks"])
    out.append(check(f"{label} world size", "world", ranks, world, ranks == world))
    out += restore_checks(label, _saved(killed, checkpoint(arm, "killed", 1)), result, full=True)
    out += continuation_checks(label, result, fit, range(s.steps_per_epoch, s.steps), None)
    writer = killed if rel != consolidated() else None
    return out + [integrity_check(label, rel, ckpts.get(rel), writer, [result])]


def fault_case(arm: str, fault: str, get, errors: dict, clean_ok: bool, s: CkptSettings) -> dict:
    """The status of one fault case: rejected, not rejected, or not executed, with the reason."""
    case = {"fault": fault, "arm": arm, "does": FAULTS[fault][1], "checks": []}
    rel, trained = fault_dir(arm, fault), training_arm(arm)
    result, fit, killed = get(rel), get(result_dir(trained, "fit")), get(result_dir(trained, "killed"))
    if result is None or fit is None or killed is None:
        return {**case, "status": "not executed", "reason": errors.get(rel, "its clean arm's results are missing")}
    if not clean_ok:
        return {**case, "status": "not executed", "reason": "the clean arm failed a required check: no reference"}
    checks = restore_checks(f"{arm} {fault}", _saved(killed, checkpoint(arm, "killed", 1)), result, full=False)
    checks += continuation_checks(f"{arm} {fault}", result, fit, range(s.steps_per_epoch, s.steps), killed)
    failed = sorted({c["family"] for c in checks if not c["passed"]})
    evidence, other = [f for f in failed if f in FAULTS[fault][0]], [f for f in failed if f not in FAULTS[fault][0]]
    if evidence and not other:
        status, reason = "rejected", "failed: " + ", ".join(evidence)
    else:
        status, reason = "not rejected", f"failed: {', '.join(failed) or 'nothing'}; attributable: " + ", ".join(
            sorted(FAULTS[fault][0]))
    return {**case, "status": status, "reason": reason, "evidence": evidence, "checks": checks}


def moved(s: CkptSettings) -> list[tuple[str, str, str, int]]:
    """(label, result, checkpoint it loads, world) of the reshard and every export."""
    half = s.half_world()
    out = [("fsdp_reshard", result_dir("fsdp", "reshard"), checkpoint("fsdp", "killed", 1), half[0] * half[1])]
    return out + [(f"export {a}", result_dir(a, "export"),
                   consolidated() if a == "fsdp" else checkpoint(a, "killed", 1), 1) for a in EXPORTED]
