"""The warm pool (issue 31): arms run one after another in warm rank processes must record exactly what arms
launched in fresh processes record, and an arm that fails, hangs or leaks state must not reach the next arm."""

from __future__ import annotations

import json
import os
import pathlib
import time

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def test_reset_puts_back_what_an_arm_changed_and_names_it():
    import torch

    from sprite.parity.pool import isolation

    base = isolation.capture()
    first = torch.rand(3)
    torch.set_default_dtype(torch.float64)
    torch.backends.cuda.matmul.allow_tf32 = not base.flags["cuda.matmul.allow_tf32"]
    handle = torch.nn.modules.module.register_module_forward_hook(lambda *a: None)
    os.environ["SPRITE_POOL_TEST_LEAK"] = "1"
    changed, leaks = isolation.reset(base)
    assert torch.get_default_dtype() == torch.float32
    assert torch.backends.cuda.matmul.allow_tf32 == base.flags["cuda.matmul.allow_tf32"]
    assert not torch.nn.modules.module._global_forward_hooks
    assert "SPRITE_POOL_TEST_LEAK" not in os.environ
    assert torch.equal(torch.rand(3), first)  # the generators are back at the pool's first state
    assert any(c.startswith("default dtype") for c in changed) and any("tf32" in c for c in changed)
    assert any("forward_hooks" in c for c in changed)
    assert leaks == []
    handle.remove()


@pytest.mark.slow
def test_a_failed_arm_spends_the_pool_and_a_hung_one_is_stopped(tmp_path):
    from sprite.parity.launch import job_fields
    from sprite.parity.pool.host import Pool

    fields = job_fields("unused.py", [], devices=1, nodes=1, strategy="single", precision="32-true",
                        accelerator="cpu")
    pool = Pool(tmp_path / "pool", fields, 1, tmp_path / "pool.log")
    code = pool.submit("sprite.parity.check.arm", ["--no-such-flag"], tmp_path / "bad.log", 300)
    assert code == 2 and pool.spent and "exit code 2" in pool.reason
    assert "arguments are required" in (tmp_path / "bad.log").read_text()  # the arm's own error, in its log
    pool.close()
    assert not pool.thread.is_alive()

    hung = Pool(tmp_path / "hung", fields, 1, tmp_path / "hung.log")
    start = time.monotonic()
    never = ["--dir", str(tmp_path / "empty"), "--host-pid", str(os.getpid())]  # waits for a task never written
    assert hung.submit("sprite.parity.pool.worker", never, tmp_path / "hung_arm.log", 3) is None
    assert "after the time limit of 3 s" in (tmp_path / "hung_arm.log").read_text()
    assert hung.spent and not hung.thread.is_alive() and time.monotonic() - start < 120


@pytest.mark.slow
def test_an_arm_whose_rank_the_other_arms_failure_ended_is_not_called_failed(tmp_path):
    """Two one-process arms run side by side on ranks 0 and 1; the failure of the one on rank 0 ends that rank and
    the launch with it. The arm on rank 1 did not fail: Pool.submit says its launch ended (ENDED), and the parity
    check runs such an arm again in fresh processes."""
    from concurrent.futures import ThreadPoolExecutor

    from sprite.parity.launch import job_fields
    from sprite.parity.pool.host import ENDED, Pool

    fields = job_fields("unused.py", [], devices=2, nodes=1, strategy="ddp", precision="32-true",
                        accelerator="cpu")
    pool = Pool(tmp_path / "pool", fields, 2, tmp_path / "pool.log")
    never = ["--dir", str(tmp_path / "empty"), "--host-pid", str(os.getpid())]  # runs until its rank is stopped
    with ThreadPoolExecutor(2) as both:
        beside = both.submit(pool.submit, "sprite.parity.pool.worker", never, tmp_path / "beside.log", 300, rank=1)
        time.sleep(1)
        failing = pool.submit("sprite.parity.check.arm", ["--no-such-flag"], tmp_path / "bad.log", 300, rank=0)
        assert failing == 2 and beside.result(timeout=200) == ENDED
    pool.close()
    assert pool.spent and not pool.thread.is_alive()


def test_the_parity_check_runs_an_arm_its_pool_ended_under_again_in_fresh_processes(tmp_path, monkeypatch):
    """parity/check/runner.py _launch: Pool.submit's ENDED sends the arm to fresh processes, with a line in its log
    (a FAKE pool and a FAKE fresh launch stand in: the real pool's side is tested above)."""
    import io

    from rich.console import Console

    from sprite.parity.check import runner
    from sprite.parity.pool.host import ENDED
    from sprite.parity.progress import ProgressBoard
    from sprite.parity.settings import Settings

    class EndedPool:
        spent, reason = False, "an arm failed (exit code 2)"

        def submit(self, *args, **kwargs):
            return ENDED

    fresh = []
    monkeypatch.setattr(runner, "launch_arm", lambda out, arm, *rest: fresh.append(arm) or 0)
    (tmp_path / "logs").mkdir()
    with ProgressBoard(Console(file=io.StringIO()), [("ref", "1 process")]) as board:
        code = runner._launch(tmp_path, "ref", None, Settings(), board, {}, 1, EndedPool(), rank=1)
    assert code == 0 and fresh == ["ref"]
    assert "runs again in fresh processes" in (tmp_path / "logs" / "ref.log").read_text()


def _records(folder: pathlib.Path) -> dict:
    import numpy as np

    found = {}
    for npz in sorted(folder.rglob("tensors.npz")):
        arm = npz.parent.relative_to(folder).as_posix()
        with np.load(npz) as data:
            found[arm] = {key: data[key].tobytes() for key in data.files}
        for rank in sorted(npz.parent.glob("rank*.json")):
            record = json.loads(rank.read_text())
            record.pop("timing", None)
            found[f"{arm}/{rank.name}"] = record
    return found


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_pooled_arms_record_bit_identical_values_to_fresh_processes(precision, tmp_path):
    from rich.console import Console

    from sprite.parity.check.runner import claim_dir, run_arms
    from sprite.parity.settings import Settings

    settings = Settings(precision=precision, devices=2, steps=2, accelerator="cpu",
                        faults=("missing-rank",) if precision == "bf16-mixed" else ())
    runs = {}
    for fresh in (True, False):
        out = tmp_path / ("fresh" if fresh else "pool")
        claim_dir(out, settings)
        times = run_arms(out, settings, Console(quiet=True), fresh=fresh)
        runs[fresh] = _records(out)
        if not fresh:
            assert all(not p["given_up"] for p in times["pools"].values()), times["pools"]
    assert runs[True].keys() == runs[False].keys() and len(runs[True]) > 2 * len(settings.arms)
    assert runs[True] == runs[False]
