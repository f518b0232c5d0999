"""`sprite parity` end to end on CPU with gloo: real processes launched through sprite's local supervisor.

Four runs are shared across the assertions (module-scoped): FP32 and BF16 with 2 ranks and with 3 ranks
(non-power-of-two); the BF16 run at 3 ranks carries every negative control (the loss-level faults and the four
DDP-only ones), so every fault kind is run and must be rejected for its own reason. Each run is the installed
`sprite` command as users type it; the BF16 run at 2 ranks is the headline command `sprite parity --precision
bf16-mixed` exactly, run in a folder of its own, so its results go to ./sprite-checks/parity-1
(tests/test_headline_commands.py says so).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from sprite.parity.check.cli import app

from conftest import OUTSIDE_CHECKOUT, WARM_SERVER

pytestmark = pytest.mark.slow
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def invoke(*args: str):
    result = CliRunner().invoke(app, list(args))
    text = result.output + (getattr(result, "stderr", "") if result.stderr_bytes is not None else "")
    return result.exit_code, text


# The headline command (README), exactly as typed: nothing added.
HEADLINE = ("parity", "--precision", "bf16-mixed")


def _run(tmp_path_factory, sprite_cmd, name: str, *args: str):
    """``sprite parity ARGS --out DIR --details`` in its own process, as a user types it: (DIR, exit code, output)."""
    out = tmp_path_factory.mktemp(name) / "run"
    done = subprocess.run([*sprite_cmd, *args, "--out", str(out), "--details"], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=1200, cwd=OUTSIDE_CHECKOUT)
    return out, done.returncode, done.stdout


@pytest.fixture(scope="module")
def fp32_2(tmp_path_factory, sprite_cmd):
    return _run(tmp_path_factory, sprite_cmd, "fp32_2", "parity", "--precision", "32-true", "--devices", "2")


@pytest.fixture(scope="module")
def fp32_3(tmp_path_factory, sprite_cmd):
    return _run(tmp_path_factory, sprite_cmd, "fp32_3", "parity", "--precision", "32-true", "--devices", "3")


@pytest.fixture(scope="module")
def bf16_2(tmp_path_factory, sprite_cmd):
    """The headline command exactly as typed, in a folder of its own: (its default --out, exit code, output)."""
    cwd = tmp_path_factory.mktemp("bf16_2")
    done = subprocess.run([*sprite_cmd, *HEADLINE], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=1200, cwd=cwd)
    return cwd / "sprite-checks" / "parity-1", done.returncode, done.stdout


@pytest.fixture(scope="module")
def bf16_3(tmp_path_factory, sprite_cmd):
    faults = ("missing-rank", "wrong-scale", "fp32-backbone", "local-adapter", "scale-grad", "skip-update")
    return _run(tmp_path_factory, sprite_cmd, "bf16_3", "parity", "--precision", "bf16-mixed", "--devices", "3",
                *(word for fault in faults for word in ("--fault", fault)))


def _report(out, name):
    return json.loads((out / name).read_text())


@pytest.mark.parametrize("fixture", ["fp32_2", "fp32_3"])
def test_fp32_parity_passes(fixture, request):
    out, code, text = request.getfixturevalue(fixture)
    assert code == 0, text
    report = _report(out, "report.json")
    assert report["verdict"] == "pass" and all(c["passed"] for c in report["checks"])
    world = int(fixture[-1])
    devices = [c["value"] for c in report["checks"] if c["family"] == "devices"]
    assert devices == [world, world]
    assert "verdict: pass" in text and "ddp pre-norm rel" in text  # --details: every check's table
    assert text.index("verdict: pass") < text.index("FP32 parity (report.json)")  # the verdict comes first
    assert "[1/3] ref: 1 process ..." in text and "about" in text  # progress, as lines when not a terminal
    assert (out / "gaps.png").read_bytes().startswith(b"\x89PNG") and f"per-step gaps: {out}" in text


@pytest.mark.parametrize("fixture", ["bf16_2", "bf16_3"])
def test_bf16_criterion_v2_passes_with_gate_and_invariants(fixture, request):
    out, code, text = request.getfixturevalue(fixture)
    assert code == 0, text
    report = _report(out, "bf16_report.json")
    assert report["verdict"] == "pass"
    for part in ("invariants", "gate", "scored"):
        assert report[part] and all(c["passed"] for c in report[part]), part
    assert len(report["scored"]) == 8 and len(report["invariants"]) == 6 * 10
    assert set(report["diagnostics"]["per_step"]) == {
        "ddp vs split", "fsdp vs split", "split_premul vs split", "ddp vs split_premul", "fsdp vs split_premul"}
    assert "bf16_vs_fp32" in report["diagnostics"]
    settings = json.loads((out / "run.json").read_text())
    assert (settings["precision"], settings["devices"]) == ("bf16-mixed", int(fixture[-1]))



EVIDENCE = {"missing-rank": {"pre_norm", "gradients"}, "wrong-scale": {"pre_norm", "gradients"},
            "scale-grad": {"pre_norm", "gradients"}, "fp32-backbone": {"dtype"},
            "local-adapter": {"synchronized"}, "skip-update": {"synchronized"}}


def test_every_fault_is_rejected_for_its_own_reason(bf16_3):
    expected = [("missing-rank", "ddp"), ("missing-rank", "fsdp"), ("wrong-scale", "ddp"), ("wrong-scale", "fsdp"),
                ("fp32-backbone", "ddp"), ("local-adapter", "ddp"), ("scale-grad", "ddp"), ("skip-update", "ddp")]
    out, code, _ = bf16_3
    report = _report(out, "faults_report.json")
    assert [(c["fault"], c["arm"]) for c in report["cases"]] == expected
    for case in report["cases"]:
        assert case["status"] == "rejected", case["reason"]
        assert case["evidence"] and set(case["evidence"]) <= EVIDENCE[case["fault"]]
    assert report["verdict"] == "pass" and code == 0


def test_compare_recomputes_the_verdict_on_a_copy(fp32_2, tmp_path, monkeypatch):
    """The reports go to a new folder DIR/compare-N: the run's own are never written over (they were), and a
    folder that takes no new one (read-only) still gets its verdict."""
    out, _, _ = fp32_2
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    before = (copy / "report.json").read_bytes(), os.stat(copy / "report.json").st_ino
    code, text = invoke("compare", str(copy))
    assert code == 0, text
    assert _report(copy / "compare-1", "report.json")["checks"] == _report(out, "report.json")["checks"]
    assert ((copy / "report.json").read_bytes(), os.stat(copy / "report.json").st_ino) == before
    assert invoke("compare", str(copy))[0] == 0 and (copy / "compare-2" / "report.json").exists()
    from sprite.integrity import writeonce

    monkeypatch.setattr(writeonce.os, "mkdir", lambda *a: (_ for _ in ()).throw(PermissionError(13, "Permission "
                                                                                               "denied")))
    code, text = invoke("compare", str(copy))
    assert code == 0 and "verdict: pass" in text and "reports: not written" in text, text
    monkeypatch.undo()
    assert "verdict: pass" in text and "FP32 parity" not in text  # without --details: verdict and summary
    result = CliRunner().invoke(app, ["compare", "--json", str(copy)])
    printed = json.loads(result.stdout)
    assert result.exit_code == 0 and printed["verdict"] == "pass"
    assert printed["reports"]["report.json"]["checks"] == _report(out, "report.json")["checks"]
    assert len(printed["reports"]["report.json"]["per_step"]["ddp vs ref"]) == 5


def test_compare_fails_clearly_on_a_corrupted_arm_result(fp32_2, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(fp32_2[0], copy)
    data = bytearray((copy / "ddp" / "tensors.npz").read_bytes())
    data[len(data) // 2] ^= 0xFF
    (copy / "ddp" / "tensors.npz").write_bytes(bytes(data))
    code, text = invoke("compare", str(copy))
    assert code == 1
    assert "ddp/tensors.npz" in text and "sha256" in text and "Traceback" not in text


def test_compare_fails_clearly_on_an_incomplete_arm(fp32_2, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(fp32_2[0], copy)
    (copy / "fsdp" / "sprite-manifest.json").unlink()
    code, text = invoke("compare", str(copy))
    assert code == 1 and "fsdp" in text and "manifest.json" in text


def test_missing_fault_case_is_not_executed_and_fails(bf16_3, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(bf16_3[0], copy)
    (copy / "fault_wrong-scale" / "fsdp" / "sprite-manifest.json").unlink()
    code, _ = invoke("compare", str(copy))
    cases = _report(copy / "compare-1", "faults_report.json")["cases"]  # the run's own report stays as it was
    assert code == 1
    assert [c["status"] for c in cases] == ["rejected"] * 3 + ["not executed"] + ["rejected"] * 4


def test_rerun_into_a_used_directory_is_refused(fp32_2):
    out = fp32_2[0]
    before = (out / "ddp" / "sprite-manifest.json").read_bytes()
    code, text = invoke("--out", str(out), "--devices", "2")
    assert code == 2 and "not empty" in text
    assert (out / "ddp" / "sprite-manifest.json").read_bytes() == before


def test_reports_are_strict_json(bf16_3):
    for name in ("bf16_report.json", "faults_report.json"):
        json.loads((bf16_3[0] / name).read_text(), parse_constant=lambda c: pytest.fail(f"{name} holds {c}"))


def test_the_headline_says_where_its_results_went_and_made_nothing_else(bf16_2):
    out, code, text = bf16_2
    assert code == 0 and "results: sprite-checks/parity-1" in text, text
    assert sorted(p.name for p in out.parent.parent.iterdir()) == ["sprite-checks"]
    assert [p.name for p in out.parent.iterdir()] == ["parity-1"]
    assert not (out / "faults_report.json").exists()  # no negative control was asked for


@pytest.mark.parametrize("args, words", [
    (["--precision", "fp8"], "--precision"),
    (["--devices", "1"], "more than one rank"),
    (["--fault", "missing-rank"], "bf16-mixed"),
    (["--precision", "bf16-mixed", "--fault", "bogus"], "--fault"),
    (["--model", "Qwen/Qwen2.5-0.5B"], "hub"),
])
def test_bad_usage_exits_2_before_running(args, words, tmp_path):
    code, text = invoke("--out", str(tmp_path / "never"), *args)
    assert code == 2 and words in text
    assert not (tmp_path / "never").exists()


def test_command_module_imports_nothing_heavy():
    probe = "import sys, sprite.parity.check.cli; print(sorted({'torch','lightning','transformers'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                         cwd=OUTSIDE_CHECKOUT).stdout
    assert out.strip() == "[]"


def test_an_arm_past_the_time_limit_ends_the_check_as_not_executed(tmp_path, monkeypatch):
    # Fresh ranks, as a user without a warm server has: their start-up outlasts the limit, and `ps` shows their
    # command lines (a warm server's forks show the server's)
    monkeypatch.delenv(WARM_SERVER, raising=False)
    out = tmp_path / "run"
    code, text = invoke("--out", str(out), "--devices", "2", "--time-limit", "2")
    assert code == 1 and "not executed: timed out after 2 s" in text
    left = subprocess.run(["ps", "-eww", "-o", "args"], capture_output=True, text=True).stdout  # ww: uncut lines
    assert str(out) not in left  # the stopped arm left nothing running
