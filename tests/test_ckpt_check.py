"""`sprite ckpt-check` end to end on CPU with gloo: real processes launched through sprite's local supervisor.

Two checks are shared across the assertions (module-scoped): FP32 and BF16, `tiny`, 2 ranks, reshard 2 -> 1, the
BF16 one with 4 launch slots. Each runs every role of the four arms, the reshard, the export and the 12 fault cases;
the other tests reuse their directories (copies where they alter something), so the module launches two checks and
one extra fit. The FP32 check is the installed `sprite ckpt-check` command exactly as users type it (the headline
command, run in a folder of its own, so its results go to ./sprite-checks/ckpt-check-1;
tests/test_headline_commands.py says so).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sprite import integrity
from sprite.parity.ckpt.cli import app
from sprite.parity.ckpt.criterion import FAMILIES
from sprite.parity.ckpt.settings import FAULTS

from conftest import WARM_SERVER

pytestmark = pytest.mark.slow
os.environ.setdefault("HF_HUB_OFFLINE", "1")
ARMS = {"single", "ddp", "fsdp", "fsdp_file", "fsdp_reshard", "export ddp", "export fsdp_file", "export fsdp"}


def invoke(*args: str):
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.output


def _run(tmp_path_factory, name: str, *args: str):
    out = tmp_path_factory.mktemp(name) / "check"
    code, text = invoke("--out", str(out), "--devices", "2", *args)
    return out, code, text


# The headline command (README), exactly as typed: its defaults are the cheapest check (2 ranks, FP32, tiny).
HEADLINE = ("ckpt-check",)


@pytest.fixture(scope="module")
def fp32(tmp_path_factory, sprite_cmd):
    """``sprite ckpt-check`` in its own process and folder: (its default --out, exit code, output)."""
    cwd = tmp_path_factory.mktemp("fp32")
    done = subprocess.run([*sprite_cmd, *HEADLINE], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=1800, cwd=cwd)
    return cwd / "sprite-checks" / "ckpt-check-1", done.returncode, done.stdout


@pytest.fixture(scope="module")
def bf16(tmp_path_factory):
    return _run(tmp_path_factory, "bf16", "--precision", "bf16-mixed", "--slots", "4")


@pytest.fixture(scope="module")
def fp32_fresh(tmp_path_factory):
    """The FP32 check with every role in processes of its own (the path before the warm pools)."""
    return _run(tmp_path_factory, "fp32fresh", "--fresh-processes")


def _outcomes(out: Path) -> dict:
    return {path.stem: json.loads(path.read_text()) for path in (out / "launches").glob("*.json")}


def _without_manifest_hashes(value):
    """A result record with every ``manifest_sha256`` taken out: a manifest records when it was written."""
    if isinstance(value, dict):
        return {k: _without_manifest_hashes(v) for k, v in value.items() if k != "manifest_sha256"}
    if isinstance(value, list):
        return [_without_manifest_hashes(v) for v in value]
    return value


def processes() -> str:
    """Every process's full command line (ww: never cut to $COLUMNS)."""
    return subprocess.run(["ps", "-eww", "-o", "args"], capture_output=True, text=True).stdout


def report_of(out: Path) -> dict:
    return json.loads((out / "checkpoint_report.json").read_text())


def flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("fixture", ["fp32", "bf16"])
def test_every_arm_passes_bit_for_bit_and_every_fault_is_rejected_for_its_reason(fixture, request):
    out, code, text = request.getfixturevalue(fixture)
    assert code == 0, text
    settings = json.loads((out / "run.json").read_text())
    assert (settings["precision"], settings["devices"], settings["nodes"], settings["model"]) == (
        {"fp32": "32-true", "bf16": "bf16-mixed"}[fixture], 2, 1, "tiny")
    report = report_of(out)
    assert report["verdict"] == "pass" and all(c["passed"] for c in report["checks"])
    assert {c["arm"] for c in report["checks"]} == ARMS
    for arm in ("single", "ddp", "fsdp", "fsdp_file"):
        names = {c["name"] for c in report["checks"] if c["arm"] == arm}
        for role in ("resume", "reload"):
            assert {f"{arm} {role} restores {family}" for family in FAMILIES} <= names
        assert {f"{arm} resume first resumed loss equals the killed fit's", f"{arm} resume lr of every step as in"
                f" the fit", f"{arm} resume rows of every step as in the fit",
                f"{arm} resume every frozen tensor changed before the load"} <= names
    cases = report["faults"]
    assert sorted((c["arm"], c["fault"]) for c in cases) == sorted(
        (arm, fault) for arm in ("single", "ddp", "fsdp", "fsdp_file") for fault in FAULTS)
    for case in cases:
        assert case["status"] == "rejected", case
        assert case["evidence"] and set(case["evidence"]) <= FAULTS[case["fault"]][0]
    verdict_line = text.index("verdict: PASS")
    assert verdict_line < text.index("Required, bit for bit") < text.index("Reported, not scored")


def test_warm_pools_run_every_role_but_the_killed_fits_and_record_what_fresh_processes_record(fp32, fp32_fresh):
    pooled, fresh = fp32[0], fp32_fresh[0]
    assert fp32[1] == 0 and fp32_fresh[1] == 0, fp32_fresh[2][-3000:]
    by_pool = {key: o["pool"] for key, o in _outcomes(pooled).items()}
    assert {key for key, pool in by_pool.items() if pool is None} == {"single-killed", "ddp-killed", "fsdp-killed"}
    assert {by_pool["ddp-fit"], by_pool["fsdp-resume"]} == {"world"} and by_pool["single-fit"].startswith("one-")
    assert all(o["pool"] is None for o in _outcomes(fresh).values())
    records = sorted(path.relative_to(fresh) for path in fresh.rglob("rank*.json") if "launches" not in path.parts)
    assert len(records) == 54
    for rel in records:  # every role's per-step values, restored state and saved state, bit for bit
        got, want = (_without_manifest_hashes(json.loads((root / rel).read_text())) for root in (pooled, fresh))
        assert got == want, rel


def test_the_headline_says_where_its_results_went_and_made_nothing_else(fp32):
    out, code, text = fp32
    assert code == 0 and "results: sprite-checks/ckpt-check-1" in text, text[-3000:]
    assert [p.name for p in out.parent.parent.iterdir()] == ["sprite-checks"]
    assert [p.name for p in out.parent.iterdir()] == ["ckpt-check-1"]


def test_one_process_roles_run_two_at_a_time_and_distributed_ones_alone(fp32):
    out = fp32[0]
    outcomes = _outcomes(out)
    assert len(outcomes) == 19 and outcomes["single-killed"]["exit_code"] == 137  # its own SIGKILL
    assert all(o["exit_code"] == 0 for key, o in outcomes.items() if not key.endswith("killed"))
    one_process = {"single-fit", "single-twin", "single-killed", "single-resume", "single-reload", "fsdp-reshard",
                   "export"}

    def overlap(a, b):
        return outcomes[a]["started"] < outcomes[b]["ended"] and outcomes[b]["started"] < outcomes[a]["ended"]

    pairs = [(a, b) for a in outcomes for b in outcomes if a < b and overlap(a, b)]
    assert pairs and all(a in one_process and b in one_process for a, b in pairs), pairs
    fit = json.loads((out / "single" / "fit" / "rank0.json").read_text())["steps"]
    assert fit[0]["rows"] != fit[3]["rows"]  # rows are reshuffled every epoch
    assert sorted(r for s in fit[:3] for r in s["rows"]) == sorted(r for s in fit[3:] for r in s["rows"])
    # docs/ckpt-check.md: a per-step LR schedule, LambdaLR 1/(1+step) from AdamW's 1e-2
    assert [step["lr"] for step in fit] == [[pytest.approx(1e-2 / (1 + n), rel=1e-12)] for n in range(len(fit))]
    manifest = json.loads((out / "checkpoints" / "fsdp-killed-epoch1" / "sprite-manifest.json").read_text())
    shards = {f"__{rank}_{i}.distcp" for rank in (0, 1) for i in range(1)}
    assert set(manifest["files"]) == {".metadata", "meta.pt", *shards}
    # Owner-only whatever the umask: the folders the check creates are 0700, the files it writes 0600.
    for folder in (out, out / "launches", out / "single" / "fit", out / "checkpoints"):
        assert folder.stat().st_mode & 0o777 == 0o700, folder
    for path in (out / "run.json", out / "single" / "fit" / "rank0.json", out / "checkpoint_report.json"):
        assert path.stat().st_mode & 0o777 == 0o600, path


def test_four_slots_run_distributed_launches_side_by_side_and_still_pass(bf16):
    out, code, _ = bf16
    outcomes = {path.stem: json.loads(path.read_text()) for path in (out / "launches").glob("*.json")}
    wide = [key for key in outcomes if key.split("-")[0] in ("ddp", "fsdp", "fsdp_file") and key != "fsdp-reshard"]
    side_by_side = [(a, b) for a in wide for b in outcomes if a != b and outcomes[a]["started"] < outcomes[b]["ended"]
                    and outcomes[b]["started"] < outcomes[a]["ended"]]
    assert code == 0 and side_by_side and json.loads((out / "run.json").read_text())["slots"] == 4


def test_reshard_resumes_at_half_the_world_with_the_same_global_batch(fp32):
    out = fp32[0]
    record = json.loads((out / "fsdp" / "reshard" / "rank0.json").read_text())
    assert record["meta"]["world"] == 1 and record["loaded"] == "checkpoints/fsdp-killed-epoch1"
    assert [len(step["rows"]) for step in record["steps"]] == [4, 4, 4]
    gaps = {row["arm"]: row for row in report_of(out)["gaps"]}
    assert set(gaps) >= {"single", "ddp", "fsdp", "fsdp_file", "fsdp_reshard", "export ddp", "ddp twin"}
    assert gaps["single"]["loss"] == 0 and gaps["fsdp"]["update"] == 0


def test_compare_recomputes_the_verdict_on_a_copy(fp32, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(fp32[0], copy)
    code, text = invoke("compare", str(copy), "--report", str(tmp_path / "again.json"))
    assert code == 0, text
    again, saved = json.loads((tmp_path / "again.json").read_text()), report_of(fp32[0])
    assert again["checks"] == saved["checks"] and again["faults"] == saved["faults"]


@pytest.mark.parametrize("victim, words", [
    ("fsdp/resume/tensors.npz", "fsdp/resume"),
    ("ddp/killed/rank1.json", "ddp/killed"),
    ("checkpoints/fsdp-killed-epoch1/__1_0.distcp", "__1_0.distcp"),
    ("checkpoints/single-resume-epoch2.ckpt", "single-resume-epoch2.ckpt"),
])
def test_an_altered_result_or_checkpoint_fails_compare(fp32, tmp_path, victim, words):
    copy = tmp_path / "copy"
    shutil.copytree(fp32[0], copy)
    flip_byte(copy / victim)
    code, text = invoke("compare", str(copy), "--report", str(tmp_path / "r.json"))
    assert code == 1 and "verdict: FAIL" in text
    failed = [str(c["value"]) for c in json.loads((tmp_path / "r.json").read_text())["checks"] if not c["passed"]]
    assert any(words in value and "SHA-256" in value and str(tmp_path) not in value for value in failed), failed


def test_a_missing_fault_case_is_not_executed_and_fails(fp32, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(fp32[0], copy)
    shutil.rmtree(copy / "single" / "fault_perturbed-weight")
    code, text = invoke("compare", str(copy), "--report", str(tmp_path / "r.json"))
    cases = {(c["arm"], c["fault"]): c for c in json.loads((tmp_path / "r.json").read_text())["faults"]}
    assert code == 1
    assert cases[("single", "perturbed-weight")]["status"] == "not executed"
    assert sum(c["status"] == "rejected" for c in cases.values()) == 11


def test_a_used_out_is_refused(fp32):
    out = fp32[0]
    before = (out / "checkpoint_report.json").read_bytes()
    code, text = invoke("--out", str(out))
    assert code == 2 and "exists already" in text
    assert (out / "checkpoint_report.json").read_bytes() == before


def test_fsdp2_resumes_a_1_device_and_a_ddp_checkpoint_of_a_lora_model(fp32, tmp_path, sprite_cmd, clean_env):
    from sprite.parity.ckpt import results as ckpt_results
    from sprite.parity.ckpt.criterion import restore_checks

    copy = tmp_path / "copy"
    shutil.copytree(fp32[0], copy)
    script = Path(__file__).parent / "scripts" / "fsdp2_cross_resume.py"
    run = subprocess.run([*sprite_cmd, "run", "--devices", "2", "--strategy", "fsdp", str(script), str(copy)],
                         env=clean_env, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    for arm in ("single", "ddp"):
        saved = ckpt_results.load(copy, f"{arm}/killed")["ranks"][0]["saves"][f"checkpoints/{arm}-killed-epoch1.ckpt"]
        resumed = ckpt_results.load(copy, f"cross/{arm}")
        checks = restore_checks(arm, [saved["state"]], resumed, full=True)
        assert len(resumed["ranks"]) == 2 and all(c["passed"] for c in checks), checks
    # Lightning's own ModelParallelStrategy still refuses it: the evidence behind sprite.runtime.ckpt.fsdp2_load.
    assert "Missing optimizer state" in (copy / "cross" / "lightning.txt").read_text()


def test_consolidate_writes_the_file_a_1_device_fit_resumed_from(fp32, tmp_path, sprite_cmd):
    import torch

    source = fp32[0] / "checkpoints" / "fsdp-killed-epoch1"
    out = tmp_path / "one.ckpt"
    run = subprocess.run([*sprite_cmd, "ckpt", "consolidate", str(source), str(out)], capture_output=True, text=True)
    assert run.returncode == 0 and "verified against its manifest" in run.stdout, run.stderr
    # The export role resumed a 1-device Lightning fit from the same consolidation and passed every check.
    exported = fp32[0] / "checkpoints" / "fsdp-killed-epoch1.consolidated.ckpt"
    assert out.read_bytes() == exported.read_bytes()
    exported_checks = [c["passed"] for c in report_of(fp32[0])["checks"] if c["arm"] == "export fsdp"]
    assert len(exported_checks) >= 12 and all(exported_checks)
    checkpoint = torch.load(out, weights_only=True)
    assert {"state_dict", "optimizer_states", "loops", "lr_schedulers", "global_step"} <= set(checkpoint)
    assert integrity.verify(out).valid  # the manifest written beside OUT
    assert all(isinstance(key, int) for key in checkpoint["optimizer_states"][0]["state"])
    again = subprocess.run([*sprite_cmd, "ckpt", "consolidate", str(source), str(out)], capture_output=True, text=True)
    assert again.returncode == 2 and "exists already" in again.stderr
    assert out.read_bytes() == exported.read_bytes()
    # Lightning's own tool still fails on this format: the evidence behind sprite.runtime.ckpt.consolidate.
    theirs = subprocess.run([sys.executable, "-m", "lightning.pytorch.utilities.consolidate_checkpoint", str(source),
                             "--output_file", str(tmp_path / "theirs.ckpt")], capture_output=True, text=True)
    assert theirs.returncode != 0 and "KeyError: 'model'" in theirs.stderr


def test_consolidate_refuses_an_altered_shard(fp32, tmp_path, sprite_cmd):
    copy = tmp_path / "fsdp-killed-epoch1"  # a sealed folder's manifest names it
    shutil.copytree(fp32[0] / "checkpoints" / "fsdp-killed-epoch1", copy)
    flip_byte(copy / "__0_0.distcp")
    run = subprocess.run([*sprite_cmd, "ckpt", "consolidate", str(copy), str(tmp_path / "x.ckpt")],
                         capture_output=True, text=True)
    assert run.returncode == 1 and "__0_0.distcp" in run.stderr and not (tmp_path / "x.ckpt").exists()


def test_a_launch_past_the_time_limit_ends_the_check_as_not_executed(tmp_path, monkeypatch):
    # Fresh ranks, as a user without a warm server has: their start-up outlasts the limit, and `ps` shows their
    # command lines (a warm server's forks show the server's)
    monkeypatch.delenv(WARM_SERVER, raising=False)
    out = tmp_path / "check"
    code, text = invoke("--out", str(out), "--devices", "2", "--time-limit", "2")
    assert code == 1 and "verdict: FAIL" in text
    assert "not executed: timed out after 2 s" in text  # the launch's line in the progress display
    # The report names what did not run. A timed-out launch whose rank still sealed its results during the stop's
    # grace period (seen on busy CI cores: SIGTERM at 2 s, SIGKILL 10 s later) is not among them; the launches the
    # check never started always are.
    assert "not executed:" in json.dumps(report_of(out)["checks"])
    outcomes = [json.loads(path.read_text()) for path in (out / "launches").glob("*.json")]
    assert any(o.get("timed_out") for o in outcomes)
    assert all(o.get("timed_out") or o.get("cancelled") or o.get("skipped") for o in outcomes)
    left = processes()
    assert str(out) not in left  # every process of the stopped launches is gone


def test_sigterm_stops_the_running_launches_and_exits_130(tmp_path, sprite_cmd, clean_env):
    import time

    out = tmp_path / "check"
    env = {k: v for k, v in clean_env.items() if k != WARM_SERVER}  # fresh ranks: `ps` shows their command lines
    proc = subprocess.Popen([*sprite_cmd, "ckpt-check", "--out", str(out)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while f"{out} --launch" not in processes():
        assert time.monotonic() < deadline and proc.poll() is None, "no launch started"
        time.sleep(0.2)
    proc.terminate()
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and "interrupted" in err
    assert str(out) not in processes()
