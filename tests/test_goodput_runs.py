"""Goodput and checkpoint cadence against ground truth: real 2-rank gloo DDP fits with a fixed step time.

tests/scripts/goodput_fit.py sleeps ``STEP`` seconds a step and logs the wall time at which rank 0 starts each
step; the truth of each category comes from that log and the scenario's design (which steps count, which are
redone), not from sprite's records:

- kill: a ModelCheckpoint every 8 steps, rank 1 SIGKILLed at step 14, ``--retries 1 --resume auto``: attempt 2
  resumes at step 8, so steps 8-13 are lost work; attempt 2's start-up is restart;
- stall: a ModelCheckpoint every 4 steps, every rank hangs at step 6, ``--stall-timeout 3``: steps 4-5 are lost,
  from the hang to the attempt's end is stall wait;
- preemption: SIGUSR1 to rank 0 at step 10 (the ranks save and exit 75), then a second `sprite run --resume
  auto`; both runs together: nothing lost, the second run's start-up is restart;
- cadence: ``--checkpoint-every 2s --keep 1`` on a script with ``enable_checkpointing=False``, rank 1 killed at
  step 14: sealed clock checkpoints in ``<default_root_dir>/checkpoints``, attempt 2 resumes from one, and its
  own save then replaces the one attempt 1 left;
- auto: ``--checkpoint-every auto --mtbf 36s --keep 1`` on a script whose ModelCheckpoint (every 100 steps)
  names a folder: the recorded interval is Young/Daly's, the saves go into that folder, one is left.
Each category within 10% of the truth (lost work also within one step), the sum equal to the total.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
from pathlib import Path

import pytest

from sprite import integrity
from sprite.integrity import audit

pytestmark = pytest.mark.slow

SCRIPT = str(Path(__file__).resolve().parent / "scripts" / "goodput_fit.py")
STEP = 0.25
WORLD = 2
# A short stall timeout beats every 0.5 s (watchdog.heartbeat_seconds): the last progress of a crashed attempt is
# then known within two steps. Runs that need no such precision get a long one: a busy machine may take more
# than 5 s from "done" to the ranks' exit, which the watchdog counts as a stall.
COMMON = ["--devices", "2", "--accelerator", "cpu", "--strategy", "ddp", "--resume", "auto",
          "--first-step-timeout", "180"]
RELAXED = ["--stall-timeout", "60"]


def _run(sprite_cmd, env, root: Path, tag: str, flags: list, script_args: list) -> dict:
    out = root / tag
    out.mkdir(exist_ok=True)
    run_dir = out / f"run-{len(list(out.glob('run-*')))}"
    argv = [*sprite_cmd, "run", *COMMON, *flags, "--run-dir", str(run_dir), SCRIPT, "--out", str(out), "--once",
            str(out / "once"), "--ckpt-dir", str(out / "ck"), "--root", str(out), *script_args]
    done = subprocess.run(argv, cwd=out, env=env, capture_output=True, text=True, timeout=300, check=False)
    return {"code": done.returncode, "log": done.stderr[-4000:], "run": run_dir, "out": out}


@pytest.fixture(scope="module")
def scenarios(sprite_cmd, tmp_path_factory):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPRITE_", "SLURM_", "PBS_")) and
           k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "NODE_RANK")}
    root = tmp_path_factory.mktemp("goodput")
    found = {
        "kill": _run(sprite_cmd, env, root, "kill", ["--retries", "1", "--stall-timeout", "5"],
                     ["--max-steps", "24", "--every", "8", "--kill-at-step", "14"]),
        "stall": _run(sprite_cmd, env, root, "stall", ["--stall-timeout", "3"],
                      ["--max-steps", "40", "--every", "4", "--hang-at-step", "6"]),
        "preempt": [_run(sprite_cmd, env, root, "preempt", RELAXED, ["--max-steps", "16", "--every", "4",
                                                                  "--preempt-at-step", "10"]) for _ in range(2)],
        "cadence": _run(sprite_cmd, env, root, "cadence", ["--retries", "1", "--checkpoint-every", "2s", "--keep", "1", *RELAXED],
                        ["--max-steps", "20", "--every", "0", "--kill-at-step", "14"]),
        "auto": _run(sprite_cmd, env, root, "auto", ["--checkpoint-every", "auto", "--mtbf", "36s", "--keep", "1", *RELAXED],
                     ["--max-steps", "20", "--every", "100"]),
    }
    return found


def report(sprite_cmd, *runs: Path) -> dict:
    done = subprocess.run([*sprite_cmd, "runs", "goodput", *map(str, runs), "--json"], capture_output=True,
                          text=True, check=False)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    return {key: value * 3600 / WORLD for key, value in result["device_hours"].items()} | {"goodput": result["goodput"]}


def steps(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines()]


def step_seconds(log: list[dict]) -> float:
    """The median time from one step's start to the next's within one attempt: the truth of a step's cost."""
    gaps = [b["t"] - a["t"] for a, b in zip(log, log[1:]) if a["attempt"] == b["attempt"] and b["step"] == a["step"] + 1]
    return statistics.median(gaps)


def trained(log: list[dict], dt: float, first: int, end: int) -> float:
    """Seconds rank 0 spent on steps ``first`` to ``end - 1`` of one attempt's log: from the start of ``first`` to
    the start of ``end`` (to the start of the last logged one plus ``dt`` when ``end`` was not reached). The real
    first step of an attempt is slower than the median (a loaded CI run saw about 0.4 s more), so it is measured,
    not taken as ``dt``."""
    starts = {e["step"]: e["t"] for e in log}
    last = max(step for step in starts if step < end)
    return (starts[end] if end in starts else starts[last] + dt) - starts[first]


def records(run: Path, kind: str) -> list[dict]:
    return [r for r in audit.read(run / "audit.jsonl") if r["kind"] == kind]


def first_step_truth(run: Path, log: list[dict], attempt: int) -> float:
    """Seconds from the attempt's start (sprite's record) to rank 0's first logged step (the script's clock)."""
    end = next(r for r in records(run, "attempt_end") if r["attempt"] == attempt)
    return min(e["t"] for e in log if e["attempt"] == str(attempt)) - end["started"]


def lost_truth(run: Path, log: list[dict], attempt: int, saved: int, last: int) -> float:
    """Seconds from the save at step ``saved`` to the start of step ``last`` (the last progress): the steps in
    between are redone. Training goes on when the save returns; under load Lightning's work after it (the
    checkpoint callback's collectives) took 0.3 s more, so the start is the save's record, checked against the
    script's clock: after step ``saved - 1`` began and before step ``saved`` did."""
    starts = {e["step"]: e["t"] for e in log if e["attempt"] == str(attempt)}
    save = next(r for r in records(run, "checkpoint_written") if r["attempt"] == attempt and r["step"] == saved)
    assert starts[saved - 1] < save["resumed_at"] <= starts[saved] + 0.01, (save, starts)
    return starts[last] - save["resumed_at"]


def close(got: float, want: float, step: float | None = None) -> bool:
    """Within 10% of the truth, and within one step when ``step`` is given (the issue's bound for lost work)."""
    return abs(got - want) <= 0.10 * want and (step is None or abs(got - want) <= step)


def check_sum(got: dict) -> None:
    parts = sum(got[k] for k in ("productive", "lost_work", "restart", "checkpoint_stall", "stall_wait", "other"))
    assert math.isclose(parts, got["total"], rel_tol=0.02)
    total = sum(r["seconds"] for r in records(got["_run"], "attempt_end")) if "_run" in got else None
    assert total is None or math.isclose(got["total"], total, rel_tol=0.02)


def test_a_killed_rank_loses_the_steps_since_the_last_checkpoint(scenarios, sprite_cmd):
    found = scenarios["kill"]
    assert found["code"] == 0, found["log"]
    log, dt = steps(found["out"]), step_seconds(steps(found["out"]))
    assert [r["step"] for r in records(found["run"], "resume")] == [8]
    got = report(sprite_cmd, found["run"])
    check_sum({**got, "_run": found["run"]})
    first, second = ([e for e in log if e["attempt"] == a] for a in ("1", "2"))
    assert close(got["productive"], trained(first, dt, 0, 8) + trained(second, dt, 8, 24)), (got, dt)
    assert close(got["lost_work"], lost_truth(found["run"], first, 1, 8, 14), step=dt), (got, dt)
    assert close(got["restart"], first_step_truth(found["run"], log, 2)), got
    assert got["stall_wait"] == 0.0 and 0 < got["checkpoint_stall"] < 2 * dt


def test_a_stalled_attempt_waits_from_the_hang_to_its_end(scenarios, sprite_cmd):
    found = scenarios["stall"]
    assert found["code"] == 124, found["log"]
    dt = step_seconds(steps(found["out"]))
    hang = json.loads((found["out"] / "hang.json").read_text())["t"]
    end = records(found["run"], "attempt_end")[0]
    got = report(sprite_cmd, found["run"])
    check_sum({**got, "_run": found["run"]})
    assert close(got["stall_wait"], end["started"] + end["seconds"] - hang), got
    assert close(got["productive"], trained(steps(found["out"]), dt, 0, 4)), (got, dt)
    assert close(got["lost_work"], lost_truth(found["run"], steps(found["out"]), 1, 4, 6), step=dt), (got, dt)
    assert got["restart"] == 0.0


def test_a_preemption_and_resume_lose_nothing_and_count_the_second_start_up_as_restart(scenarios, sprite_cmd):
    first, second = scenarios["preempt"]
    assert (first["code"], second["code"]) == (75, 0), first["log"] + second["log"]
    log, dt = steps(first["out"]), step_seconds(steps(first["out"]))
    assert [r["step"] for r in records(second["run"], "resume")] == [11]
    got = report(sprite_cmd, first["run"], second["run"])
    check_sum(got)
    run2_start = records(second["run"], "attempt_end")[0]["started"]
    before, after = [e for e in log if e["t"] < run2_start], [e for e in log if e["t"] > run2_start]
    assert close(got["productive"], trained(before, dt, 0, 11) + trained(after, dt, 11, 16)), (got, dt)
    assert got["lost_work"] <= dt, got
    resumed = [e["t"] for e in after]
    assert close(got["restart"], min(resumed) - run2_start), got


def test_checkpoint_every_saves_sealed_checkpoints_that_resume_auto_continues_from(scenarios):
    found = scenarios["cadence"]
    assert found["code"] == 0, found["log"]
    written = records(found["run"], "checkpoint_written")
    assert written and all(r["verified"] and "sprite-every-step=" in r["path"] for r in written)
    kept = sorted((found["out"] / "checkpoints").glob("sprite-every-step=*.ckpt"))
    assert [str(path) for path in kept] == [written[-1]["path"]] and integrity.verify(kept[0]).valid
    assert written[-1]["attempt"] == 2 and any(r["attempt"] == 1 for r in written)  # --keep 1 across attempts
    resumed = records(found["run"], "resume")
    assert len(resumed) == 1 and "sprite-every-step=" in resumed[0]["path"]
    log = steps(found["out"])
    assert min(e["step"] for e in log if e["attempt"] == "2") == resumed[0]["step"] > 0
    first_attempt = [r["resumed_at"] for r in written if r["attempt"] == 1]
    starts = records(found["run"], "first_step")
    assert all(1.5 <= b - a <= 2 + 3 * STEP for a, b in zip([starts[0]["wall"], *first_attempt], first_attempt))


def test_auto_records_young_daly_and_keeps_the_newest_of_its_own(scenarios):
    found = scenarios["auto"]
    assert found["code"] == 0, found["log"]
    chosen = records(found["run"], "checkpoint_interval")
    assert chosen and chosen[0]["mtbf_hours"] == pytest.approx(0.01)
    for record in chosen:
        assert record["seconds"] == pytest.approx(math.sqrt(2 * record["save_seconds"] * 36), rel=0.05)
    first_save = records(found["run"], "checkpoint_written")[0]
    # C is the first save as the training loop saw it (the whole save_checkpoint call), so at least the stall the
    # seal recorded inside it; the rest of that call (Lightning gathering the state) took 0.22 s more once on a
    # loaded CI machine, so the upper bound only checks that C is that save, not a later one.
    assert first_save["stall_seconds"] <= chosen[0]["save_seconds"] <= first_save["stall_seconds"] + 1.0
    written = [r["path"] for r in records(found["run"], "checkpoint_written")]
    kept = sorted(str(p) for p in (found["out"] / "ck").glob("sprite-every-step=*.ckpt"))
    assert len(written) >= 2 and kept == [written[-1]]
