"""Fast unit tests of the pure parity criterion: each check passes on consistent records and fails when
its own input is broken. No torch, no processes."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest

from sprite.parity import criterion
from sprite.parity.check import bf16
from sprite.parity.check import faults
from sprite.parity.check.invariants import expected_shards, invariants
from sprite.parity.settings import Settings, arm_world, shard_rows, step_rows
from sprite.parity.store import clean

SETTINGS = Settings(precision="bf16-mixed", devices=3)
NAMES = ("a.lora_A", "a.lora_B", "head.weight")


def _tensors(seed: float) -> dict:
    rng = np.random.default_rng(0)
    init = {n: rng.normal(size=(4, 3)).astype(np.float32) for n in NAMES}
    out = {f"init/{n}": v for n, v in init.items()}
    for step in range(SETTINGS.steps):
        for n in NAMES:
            grad = (np.ones((4, 3)) * (step + 1) * seed).astype(np.float32)
            out[f"grad/{step}/{n}"] = grad
            out[f"param/{step}/{n}"] = (init[n] - 0.001 * (step + 1) * seed).astype(np.float32)
    return out


def _arm(name: str, settings: Settings = SETTINGS, scale: float = 1.0) -> dict:
    world = arm_world(name, settings)
    comm = {"ddp": {"kind": "ddp", "comm_hooks": 0, "mixed_precision": "None", "param_dtypes": ["torch.float32"]},
            "fsdp": {"kind": "fsdp2", "param_dtype": "None", "reduce_dtype": "None",
                     "param_dtypes": ["torch.float32"]}}.get(name, {"kind": "none"})
    meta = {"precision": settings.precision, "model": settings.model, "seed": settings.seed, "world": world,
            "global_batch": settings.global_batch, "steps": settings.steps, "fault": None}
    ranks = []
    for rank in range(world):
        steps = [{"step": s, "shards": expected_shards(name, rank, s, settings), "loss": 0.7,
                  "pre_norm": 2.0 * scale, "post_norm": settings.clip, "grad_digest": f"g{s}", "param_digest": f"p{s}",
                  "grads_not_sharded": 0, "params_not_sharded": 0,
                  "grad_health": {"missing": 0, "not_fp32": 0, "not_finite": 0},
                  "linear": {"sites": 31, "invalid": 0, "examples": []}} for s in range(settings.steps)]
        ranks.append({"meta": dict(meta), "comm": comm, "initial_digest": "init", "frozen_changed": 0,
                      "frozen_count": 26, "steps": steps})
    return {"ranks": ranks, "tensors": _tensors(scale)}


def _passes(checks, family=None):
    return all(c["passed"] for c in checks if family is None or c["family"] == family)


def test_rows_follow_strided_distributed_sampler_order():
    assert shard_rows(0, 1, 3, 6) == [1, 4]
    assert shard_rows(1, 2, 3, 6) == [8, 11]
    assert sorted(sum((shard_rows(2, r, 3, 6) for r in range(3)), [])) == step_rows(2, 6)


@pytest.mark.parametrize("arm", ["ref32", "ref", "split", "split_premul", "ddp", "fsdp"])
def test_invariants_pass_on_consistent_records(arm):
    assert _passes(invariants(arm, _arm(arm), SETTINGS, "init"))


BREAKS = {
    "metadata": lambda r: r["meta"].update(world=7),
    "steps": lambda r: r["steps"].pop(),
    "initial": lambda r: r.update(initial_digest="other"),
    "frozen": lambda r: r.update(frozen_changed=1),
    "communication": lambda r: r["comm"].update(comm_hooks=1, reduce_dtype="torch.bfloat16"),
    "clip": lambda r: r["steps"][2].update(post_norm=SETTINGS.clip * 1.001),
    "grad_health": lambda r: r["steps"][1]["grad_health"].update(not_finite=1),
    "dtype": lambda r: r["steps"][3]["linear"].update(invalid=1),
    "rows": lambda r: r["steps"][0].update(shards=[[0, 1]]),
}


@pytest.mark.parametrize("family", sorted(BREAKS))
def test_each_invariant_fails_when_its_input_is_broken(family):
    arm = _arm("ddp")
    BREAKS[family](arm["ranks"][-1])
    checks = invariants("ddp", arm, SETTINGS, "init")
    assert not _passes(checks, family)


def test_clip_inactive_fails():
    arm = _arm("ref")
    arm["ranks"][0]["steps"][0]["pre_norm"] = SETTINGS.clip / 2
    assert not _passes(invariants("ref", arm, SETTINGS, "init"), "clip")


@pytest.mark.parametrize("key", ["grad_digest", "param_digest"])
def test_ddp_replica_disagreement_fails_synchronized(key):
    arm = _arm("ddp")
    arm["ranks"][1]["steps"][4][key] = "different"
    assert not _passes(invariants("ddp", arm, SETTINGS, "init"), "synchronized")


def test_fsdp_unsharded_trainable_fails_synchronized():
    arm = _arm("fsdp")
    arm["ranks"][0]["steps"][0]["params_not_sharded"] = 1
    assert not _passes(invariants("fsdp", arm, SETTINGS, "init"), "synchronized")


def test_scored_checks_pass_on_equal_arms_and_fail_per_input():
    split = _arm("split")
    assert _passes(bf16.scored("ddp", _arm("ddp"), split))
    worse = _arm("ddp")
    worse["ranks"][2]["steps"][0]["pre_norm"] *= 1.002
    assert not _passes(bf16.scored("ddp", worse, split), "pre_norm")
    worse = _arm("ddp")
    worse["tensors"]["grad/0/a.lora_B"] = worse["tensors"]["grad/0/a.lora_B"] * 1.01
    assert not _passes(bf16.scored("ddp", worse, split), "gradients")
    worse = _arm("ddp")
    worse["tensors"]["param/0/head.weight"] = worse["tensors"]["param/0/head.weight"] + 0.001
    checks = bf16.scored("ddp", worse, split)
    assert not _passes(checks, "update") and not _passes(checks, "tensor_updates")


def test_tensor_bound_is_additive_as_specified():
    ref = np.full(100, 1.0)
    bound = 1e-3 * 10.0 + 1e-12 * 10.0
    assert bf16.per_tensor({"t": ref + bound / 10 * 0.99}, {"t": ref})["over"] == 0
    assert bf16.per_tensor({"t": ref + bound / 10 * 1.01}, {"t": ref})["over"] == 1


def test_verdict_order_fail_void_pass():
    ok, bad = [{"passed": True}], [{"passed": False}]
    assert bf16.verdict(ok, ok, ok) == "pass"
    assert bf16.verdict(ok, bad, ok) == "void"
    assert bf16.verdict(bad, ok, ok) == "fail"
    assert bf16.verdict(ok, ok, bad) == "fail"
    assert bf16.verdict(ok, bad, bad) == "void"


def test_the_checks_verdict_and_exit_code_follow_its_reports(monkeypatch, tmp_path):
    """docs/parity.md: exit 0 on pass, 1 on fail or void; the main report's void is the check's verdict."""
    import typer

    from sprite.parity.check import cli, plot
    from sprite.parity.check.compare import overall

    void = {"bf16_report.json": {"verdict": "void"}, "faults_report.json": {"verdict": "pass"}}
    assert overall(void) == "void"
    assert overall({"bf16_report.json": {"verdict": "pass"}, "faults_report.json": {"verdict": "fail"}}) == "fail"
    assert overall({"fp32_report.json": {"verdict": "pass"}}) == "pass"
    monkeypatch.setattr(plot, "write_png", lambda out, reports: None)
    for reports, code in ((void, 1), ({"fp32_report.json": {"verdict": "pass"}}, 0)):
        with pytest.raises(typer.Exit) as caught:
            cli._finish(tmp_path, reports, False, True)
        assert caught.value.exit_code == code


def test_fp32_rule_each_check_fails_when_broken():
    settings = Settings(precision="32-true", devices=2)
    arms = {n: _arm(n, settings) for n in ("ref", "ddp", "fsdp")}
    assert _passes(criterion.fp32_checks(arms, settings.steps))
    broken = copy.deepcopy(arms)
    broken["ddp"]["ranks"][1]["steps"][3]["pre_norm"] *= 1.0002
    assert not _passes(criterion.fp32_checks(broken, 5), "pre_norm")
    broken = copy.deepcopy(arms)
    broken["fsdp"]["ranks"][0]["steps"][4]["post_norm"] *= 1.0002
    assert not _passes(criterion.fp32_checks(broken, 5), "post_norm")
    broken = copy.deepcopy(arms)
    broken["fsdp"]["tensors"]["param/4/a.lora_A"] = broken["fsdp"]["tensors"]["param/4/a.lora_A"] + 1e-3
    assert not _passes(criterion.fp32_checks(broken, 5), "update")
    broken = copy.deepcopy(arms)
    broken["ddp"]["ranks"][0]["frozen_changed"] = 2
    assert not _passes(criterion.fp32_checks(broken, 5), "frozen")
    broken = copy.deepcopy(arms)
    for record in broken["ddp"]["ranks"]:
        record["meta"]["world"] = 1
    assert not _passes(criterion.fp32_checks(broken, 5), "devices")
    assert not _passes(criterion.fp32_checks({**arms, "fsdp": None}, 5), "present")


def test_fault_case_needs_attributable_evidence_and_a_clean_baseline():
    failed_sync = [{"family": "synchronized", "passed": False}, {"family": "pre_norm", "passed": True}]
    assert faults.judge("skip-update", "ddp", failed_sync, True)["status"] == "rejected"
    assert faults.judge("wrong-scale", "ddp", failed_sync, True)["status"] == "not rejected"
    assert faults.judge("skip-update", "ddp", failed_sync, False)["status"] == "not executed"
    assert faults.judge("skip-update", "ddp", None, True)["status"] == "not executed"
    assert faults.cases(("missing-rank", "scale-grad")) == [
        ("missing-rank", "ddp"), ("missing-rank", "fsdp"), ("scale-grad", "ddp")]


def test_reports_are_nan_free():
    text = json.dumps(clean({"a": float("nan"), "b": [float("inf"), 1.0]}), allow_nan=False)
    assert json.loads(text) == {"a": None, "b": [None, 1.0]}
    assert not criterion.check("x", "f", float("nan"), 1.0, True)["passed"]


def test_the_recipe_is_the_one_docs_parity_describes():
    """docs/parity.md: peft LoRA r=8, alpha=16 on q/k/v/o, a 2-class head with a bias; qwen2.5-0.5b-shape holds 194
    trainable tensors (built on the meta device: shapes only). Every arm shares the recipe, so a change to it would
    pass every other test."""
    import torch

    from sprite.parity import recipe
    from sprite.parity.settings import Settings

    with torch.device("meta"):
        model = recipe.build_model(Settings(model="qwen2.5-0.5b-shape"))
    assert sum(p.requires_grad for p in model.parameters()) == 194
    lora = model.backbone.peft_config["default"]
    assert (lora.r, lora.lora_alpha, sorted(lora.target_modules)) == (8, 16, ["k_proj", "o_proj", "q_proj", "v_proj"])
    assert model.head.out_features == 2 and model.head.bias is not None
