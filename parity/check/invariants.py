"""BF16 criterion v2 invariants, on every arm and every step. Pure: recorded numbers in, checks out.

Metadata and world size; step count; initial trainables bit-identical to the reference; frozen tensors
unchanged; fp32 communication; clip active with the post-clip norm within 1e-4 of the clip; present, finite,
fp32 gradients; every Linear at the requested dtype under the expected autocast state; exact rows and rank
shards; and synchronisation: DDP replicas bitwise equal (gradients before clipping, parameters after every
update), FSDP2 trainables sharded DTensors whose gathered values are bitwise equal on every rank.
"""

from __future__ import annotations

from sprite.parity.criterion import check
from sprite.parity.settings import Settings, arm_world, shard_rows, step_rows

CLIP_REL = 1e-4


def expected_shards(arm: str, rank: int, step: int, settings: Settings) -> list[list[int]]:
    """The rows each recorded shard of ``arm`` must hold at ``step``."""
    if arm in ("ddp", "fsdp"):
        return [shard_rows(step, rank, settings.world, settings.global_batch)]
    if arm in ("split", "split_premul"):
        return [shard_rows(step, r, settings.world, settings.global_batch) for r in range(settings.world)]
    return [step_rows(step, settings.global_batch)]


def _every(records, test) -> int:
    """Number of (rank, step) observations for which ``test(rank, record, step)`` is false."""
    return sum(not test(rank, record, step) for rank, record in enumerate(records) for step in record["steps"])


def _metadata(arm, records, settings, fault) -> bool:
    want = {"precision": settings.precision, "model": settings.model, "seed": settings.seed,
            "global_batch": settings.global_batch, "steps": settings.steps, "fault": fault,
            "world": arm_world(arm, settings)}
    return len(records) == arm_world(arm, settings) and all(
        all(r["meta"].get(k) == v for k, v in want.items()) for r in records)


def _communication(arm: str, comm: dict) -> bool:
    fp32 = comm.get("param_dtypes") == ["torch.float32"] or arm not in ("ddp", "fsdp")
    if arm == "ddp":
        return fp32 and comm.get("kind") == "ddp" and comm.get("comm_hooks") == 0 and comm.get("mixed_precision") == "None"
    if arm == "fsdp":
        return fp32 and comm.get("kind") == "fsdp2" and {comm.get("param_dtype"), comm.get("reduce_dtype")} <= {
            "None", "torch.float32"}
    return comm.get("kind") == "none"


def _synchronized(arm: str, records: list[dict]) -> tuple[int, int]:
    """(gradient disagreements, parameter disagreements) over steps; FSDP2 also counts unsharded tensors."""
    steps = min(len(r["steps"]) for r in records)
    grads = sum(len({r["steps"][s].get("grad_digest") for r in records}) != 1 for s in range(steps))
    params = sum(len({r["steps"][s].get("param_digest") for r in records}) != 1 for s in range(steps))
    if arm == "fsdp":
        grads += sum(step.get("grads_not_sharded", 1) != 0 for r in records for step in r["steps"])
        params += sum(step.get("params_not_sharded", 1) != 0 for r in records for step in r["steps"])
    return grads, params


def invariants(arm: str, data: dict, settings: Settings, initial_digest: str, fault: str | None = None) -> list[dict]:
    """All invariants of one arm; ``initial_digest`` is the reference's digest of the initial trainables."""
    records, clip = data["ranks"], settings.clip
    label = f"fault_{fault}/{arm}" if fault else arm
    n = sum(len(r["steps"]) for r in records)
    out = [
        check(f"{label} metadata and world size", "metadata", len(records), arm_world(arm, settings),
              _metadata(arm, records, settings, fault)),
        check(f"{label} step count", "steps", [len(r["steps"]) for r in records], settings.steps,
              all(len(r["steps"]) == settings.steps for r in records)),
        check(f"{label} initial trainables bit-identical", "initial", "equal" if all(
            r["initial_digest"] == initial_digest for r in records) else "differ", "equal",
              all(r["initial_digest"] == initial_digest for r in records)),
        check(f"{label} frozen tensors changed", "frozen", sum(r["frozen_changed"] for r in records), 0,
              all(r["frozen_changed"] == 0 for r in records)),
        check(f"{label} fp32 communication", "communication", records[0]["comm"].get("kind"), "fp32, no hook",
              all(_communication(arm, r["comm"]) for r in records)),
    ]
    bad_clip = _every(records, lambda _, r, s: s.get("pre_norm") is not None and s["pre_norm"] > clip
                      and s.get("post_norm") is not None and abs(s["post_norm"] - clip) <= CLIP_REL * clip)
    bad_grads = _every(records, lambda _, r, s: not any(s["grad_health"].values()))
    bad_linear = _every(records, lambda _, r, s: s.get("linear", {}).get("sites", 0) > 0
                        and s["linear"]["invalid"] == 0)
    bad_rows = _every(records, lambda rank, r, s: s["shards"] == expected_shards(arm, rank, s["step"], settings))
    grads, params = _synchronized(arm, records)
    out += [
        check(f"{label} clip active, post-clip norm at clip", "clip", f"{bad_clip}/{n} bad", "0", bad_clip == 0),
        check(f"{label} gradients present, finite, fp32", "grad_health", f"{bad_grads}/{n} bad", "0", bad_grads == 0),
        check(f"{label} Linear dtype and autocast state", "dtype", f"{bad_linear}/{n} bad", "0", bad_linear == 0),
        check(f"{label} rows and rank shards", "rows", f"{bad_rows}/{n} bad", "0", bad_rows == 0),
        check(f"{label} replicas synchronized", "synchronized", f"grads {grads}, params {params}", "0, 0",
              grads == 0 and params == 0),
    ]
    return out
