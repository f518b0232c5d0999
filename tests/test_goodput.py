"""`sprite runs goodput`'s arithmetic over hand-written audit records and heartbeats (no training; the ground-truth
runs are tests/test_goodput_runs.py), and the checkpoint cadence's pure parts."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sprite import contract
from sprite.cli import goodput as cli_goodput
from sprite.contract import heartbeat
from sprite.contract.heartbeat import Beat
from sprite.errors import UsageError
from sprite.integrity import audit
from sprite.recovery import goodput, rundir
from sprite.values import grammar

T0 = 1_000_000.0
SHAPE = ["total", "productive", "lost_work", "restart", "checkpoint_stall", "stall_wait", "other"]


def beat(step: int, t: float, phase: str = heartbeat.TRAINING, rank: int = 0) -> Beat:
    return Beat(rank, "h", 1, step, phase, 1, t, 0)


def attempt(number, start, seconds, cause, first=None, saves=(), resume=False, world=2) -> list[dict]:
    """The records of one attempt as sprite writes them, in order."""
    out = [{"kind": "attempt_start", "attempt": number}]
    if resume:
        out.append({"kind": "resume", "path": "ck/x.ckpt", "step": 0})
    if first is not None:
        out.append({"kind": "first_step", "attempt": number, "step": 0, "wall": start + first})
    for step, at, stall, sealed in saves:
        out.append({"kind": "checkpoint_written", "path": f"ck/{step}", "step": step, "verified": sealed,
                    "stall_seconds": stall, "resumed_at": start + at, "attempt": number})
    out.append({"kind": "attempt_end", "attempt": number, "started": start, "seconds": seconds, "cause": cause,
                "world_size": world})
    return out


def seconds_of(result: dict, world: int = 2) -> dict:
    return {key: value * 3600 / world for key, value in result["device_hours"].items()}


def test_a_killed_rank_splits_into_startup_lost_work_restart_and_productive():
    # attempt 1: starts at T0, first step at +10, saves at step 8 (+12 resumed, 0.5 s stall), last progress step 14
    # at +13.5, crash noticed and ended at +15. Attempt 2 at +20: first step at +30, done at +34, ended at +35.
    records = [*attempt(1, T0, 15.0, "application fault", 10.0, [(8, 12.0, 0.5, True)]),
               *attempt(2, T0 + 20, 15.0, "success", 10.0, [(16, 12.0, 0.25, True)], resume=True)]
    beats = {1: [beat(14, T0 + 13.5), beat(13, T0 + 13.2, rank=1)],
             2: [beat(24, T0 + 34.0, heartbeat.DONE), beat(24, T0 + 34.0, heartbeat.DONE, 1)]}
    got = seconds_of(goodput.account([(records, beats)]))
    assert got["restart"] == pytest.approx(10.0)  # attempt 2's relaunch to first step
    assert got["lost_work"] == pytest.approx(1.5)  # +12 (after the save) to +13.5
    assert got["checkpoint_stall"] == pytest.approx(0.75)
    assert got["productive"] == pytest.approx((12.0 - 10.0 - 0.5) + (34.0 - 30.0 - 0.25))
    assert got["stall_wait"] == 0.0
    assert got["other"] == pytest.approx(10.0 + 1.5 + 1.0)  # first start-up, crash to end, teardown
    assert got["total"] == pytest.approx(30.0)
    assert math.isclose(sum(got[k] for k in goodput.CATEGORIES), got["total"], rel_tol=1e-5)


def test_json_has_exactly_the_documented_shape_and_goodput_is_productive_over_total():
    result = goodput.account([(attempt(1, T0, 100.0, "success", 20.0), {1: [beat(50, T0 + 90, heartbeat.DONE)]})])
    assert list(result) == ["device_hours", "goodput"] and list(result["device_hours"]) == SHAPE
    assert result["goodput"] == pytest.approx(0.7, abs=1e-4)
    assert seconds_of(result)["other"] == pytest.approx(30.0)  # the first start-up is no restart
    # ... unless it resumed from a checkpoint (sprite run --resume auto by hand, after a run that ended)
    resumed = goodput.account([(attempt(1, T0, 100.0, "success", 20.0, resume=True),
                                {1: [beat(50, T0 + 90, heartbeat.DONE)]})])
    assert seconds_of(resumed)["restart"] == pytest.approx(20.0) and seconds_of(resumed)["other"] == \
        pytest.approx(10.0)


def test_a_stalled_attempt_waits_from_its_last_progress_and_loses_work_since_its_checkpoint():
    records = attempt(1, T0, 40.0, "stall", 5.0, [(4, 9.0, 1.0, True)])
    got = seconds_of(goodput.account([(records, {1: [beat(6, T0 + 11.0), beat(6, T0 + 11.0, rank=1)]})]))
    assert got["stall_wait"] == pytest.approx(29.0)
    assert got["lost_work"] == pytest.approx(2.0)
    assert got["productive"] == pytest.approx(3.0)
    assert got["checkpoint_stall"] == pytest.approx(1.0)


def test_a_preemption_save_of_the_last_step_loses_nothing_and_the_requeued_run_restarts():
    first = attempt(1, T0, 30.0, "preemption", 10.0, [(11, 28.0, 0.5, True)])
    second = attempt(1, T0 + 100, 20.0, "success", 8.0)
    runs = [(first, {1: [beat(11, T0 + 29.0, heartbeat.PREEMPTED)]}),
            (second, {1: [beat(20, T0 + 118.0, heartbeat.DONE)]})]
    got = seconds_of(goodput.account(runs))
    assert got["lost_work"] == 0.0
    assert got["restart"] == pytest.approx(8.0)  # the requeued run's start-up is a restart
    assert got["productive"] == pytest.approx((28.0 - 10.0 - 0.5) + (118.0 - 108.0))


def test_without_a_sealed_checkpoint_everything_the_attempt_trained_is_lost():
    records = attempt(1, T0, 20.0, "node fault", 5.0, [(8, 9.0, 0.5, False)])  # the save was not sealed
    got = seconds_of(goodput.account([(records, {1: [beat(10, T0 + 12.0)]})]))
    assert got["lost_work"] == pytest.approx(12.0 - 5.0 - 0.5) and got["productive"] == 0.0


def test_an_attempt_that_never_trained_is_restart_or_other_and_bad_records_count_as_missing():
    records = [*attempt(1, T0, 10.0, "application fault"), *attempt(2, T0 + 10, 10.0, "application fault")]
    records.insert(1, {"kind": "first_step", "attempt": 1, "wall": "soon"})
    got = seconds_of(goodput.account([(records, {})]))
    assert (got["other"], got["restart"], got["productive"]) == (pytest.approx(10.0), pytest.approx(10.0), 0.0)
    assert goodput.account([([{"kind": "attempt_end"}, "junk"], {})])["device_hours"]["total"] == 0.0


def _trail(run: Path, job_id: str, start: float, time_first: float, cause: str, scheduler: str = "slurm",
           answer: str = "") -> Path:
    rundir.create(run)
    trail = run / rundir.AUDIT
    audit.append(trail, "launch", run_dir=str(run), scheduler=scheduler if job_id else "none", job_id=job_id)
    for record in attempt(1, start, 10.0, cause, time_first):
        audit.append(trail, record.pop("kind"), **record)
    if answer:
        audit.append(trail, "requeue", requested=True, accepted=True, scheduler=scheduler, job_id=job_id,
                     command=["qsub"], exit_code=0, answer=answer)
    where = rundir.attempt_heartbeats(run, 1)
    heartbeat.write(where, beat(5, start + 9.0, heartbeat.DONE))
    return run


def test_the_report_covers_every_run_of_a_batch_job_and_only_those(tmp_path):
    _trail(tmp_path / "a", "77", T0, 2.0, "preemption")
    _trail(tmp_path / "b", "77", T0 + 50, 3.0, "success")
    _trail(tmp_path / "c", "78", T0 + 90, 3.0, "success")
    assert [p.name for p in goodput.job_runs(tmp_path / "b")] == ["a", "b"]
    assert [p.name for p in goodput.job_runs(_trail(tmp_path / "d", "", T0, 1.0, "success"))] == ["d"]
    got = seconds_of(cli_goodput.report([str(tmp_path / "b")]), world=2)
    assert got["total"] == pytest.approx(20.0) and got["restart"] == pytest.approx(3.0)
    assert got["other"] == pytest.approx(2.0 + 1.0 + 1.0)


def test_the_command_prints_json_and_a_table_and_refuses_a_folder_without_a_trail(tmp_path):
    run = _trail(tmp_path / "r", "", T0, 2.0, "success")
    # cwd outside the checkout: `-m sprite` from there would import the checkout's sprite, which lacks the
    # installed sprite.parity under a plain (not editable) install, as in CI
    done = subprocess.run([sys.executable, "-m", "sprite", "runs", "goodput", str(run), "--json"],
                          capture_output=True, text=True, check=False, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert list(result["device_hours"]) == SHAPE and result["goodput"] == pytest.approx(0.7, abs=1e-3)
    table = subprocess.run([sys.executable, "-m", "sprite", "runs", "goodput", str(run)], capture_output=True,
                           text=True, check=False, cwd=tmp_path).stdout
    assert "productive" in table and "goodput 70.0%" in table
    bad = subprocess.run([sys.executable, "-m", "sprite", "runs", "goodput", str(tmp_path)], capture_output=True,
                         text=True, check=False, cwd=tmp_path)
    assert bad.returncode == 2 and "holds no audit trail" in bad.stderr
    with pytest.raises(UsageError):
        cli_goodput.folders([])


def test_durations_take_units_and_the_cadence_takes_auto():
    def complain(what, allowed):
        return UsageError(what, "", allowed)

    assert [grammar.span(t, complain) for t in ("90", "30s", "10min", "1.5h", "2d")] == [90, 30, 600, 5400, 172800]
    assert grammar.cadence("auto", complain) == "auto" and grammar.cadence("2s", complain) == "2.0"
    for bad in ("0", "-1s", "3x", "h", ""):
        with pytest.raises(UsageError):
            grammar.span(bad, complain)


def test_young_daly_is_the_square_root_of_twice_the_save_cost_times_the_mtbf():
    from sprite.runtime.ckpt import cadence  # imports lightning

    assert cadence.young_daly(2.0, 3600.0) == pytest.approx(120.0)
    assert cadence.young_daly(0.5, 86400.0) == pytest.approx(math.sqrt(86400.0))
    env = {"SPRITE_CHECKPOINT_EVERY": "auto", "SPRITE_MTBF": "3600.0", "SPRITE_KEEP": "3"}
    assert cadence.settings(env) == ("auto", 3600.0, 3)
    assert cadence.settings({"SPRITE_CHECKPOINT_EVERY": "2.0"}) == (2.0, None, 2)
    for broken in ({"SPRITE_CHECKPOINT_EVERY": "auto"}, {"SPRITE_CHECKPOINT_EVERY": "0"},
                   {"SPRITE_CHECKPOINT_EVERY": "2", "SPRITE_KEEP": "0"}):
        with pytest.raises(UsageError):
            cadence.settings(broken)


@pytest.mark.parametrize("flags, words", [
    (["--checkpoint-every", "auto"], "needs the mean time between failures"),
    (["--checkpoint-every", "3x"], "is not a duration"),
    (["--keep", "3"], "saves none"),
    (["--mtbf", "1h"], "Add --checkpoint-every auto, or drop --mtbf"),  # a site profile's alone is unused
    (["--checkpoint-every", "1h", "--keep", "0"], "--keep"),
])
def test_bad_cadence_flags_exit_2_with_the_fix(flags, words, tmp_path):
    script = tmp_path / "t.py"
    script.write_text("")
    done = subprocess.run([sys.executable, "-m", "sprite", "run", "--dry-run", *flags, str(script)],
                          capture_output=True, text=True, cwd=tmp_path, check=False)
    assert done.returncode == 2 and words in done.stderr and done.stderr.count("\n") == 1, done.stderr


def test_the_cadence_reaches_the_ranks_as_contract_variables(tmp_path):
    script = tmp_path / "t.py"
    script.write_text("")
    done = subprocess.run([sys.executable, "-m", "sprite", "run", "--dry-run", "--json", "--checkpoint-every",
                           "auto", "--mtbf", "24h", "--keep", "3", str(script)], capture_output=True, text=True,
                          cwd=tmp_path, check=False)
    env = json.loads(done.stdout)["env"]
    assert (env["SPRITE_CHECKPOINT_EVERY"], env["SPRITE_MTBF"], env["SPRITE_KEEP"]) == ("auto", "86400.0", "3")
    plain = subprocess.run([sys.executable, "-m", "sprite", "run", "--dry-run", "--json", str(script)],
                           capture_output=True, text=True, cwd=tmp_path, check=False)
    assert "SPRITE_CHECKPOINT_EVERY" not in json.loads(plain.stdout)["env"]


def test_a_cadence_or_writer_exported_in_the_shell_does_not_reach_the_ranks_only_the_flags_do(tmp_path):
    """contract.ASKED_FOR: a stale export must not turn on saves, or pick a writer, the run did not ask for."""
    script = tmp_path / "t.py"
    script.write_text("import json, os\n"
                      f"names = {contract.ASKED_FOR!r}\n"
                      "open('seen.json', 'w').write(json.dumps({n: os.environ.get(n) for n in names}))\n")
    stale = {contract.CHECKPOINT_EVERY: "5", contract.KEEP: "9", contract.MTBF: "60",
             contract.CHECKPOINT_WRITER: "fork", contract.LOG_DIR: "/proc/x", contract.CONSOLE_RANKS: "zz",
             contract.STACKS_AFTER: "1,1,1"}  # the last three made the rank fail, or dump its stacks unasked
    done = subprocess.run([sys.executable, "-m", "sprite", "run", "--accelerator", "cpu", "--devices", "1",
                           "--checkpoint-every", "1h", str(script)], capture_output=True, text=True, cwd=tmp_path,
                          env={**os.environ, **stale}, check=False)
    assert done.returncode == 0, done.stderr
    seen = json.loads((tmp_path / "seen.json").read_text())
    assert seen == {contract.CHECKPOINT_EVERY: "3600.0", contract.KEEP: "2", contract.MTBF: None,
                    contract.CHECKPOINT_WRITER: None, contract.LOG_DIR: None, contract.CONSOLE_RANKS: None,
                    contract.STACKS_AFTER: None}, seen


def test_runs_show_has_a_goodput_section(tmp_path):
    from sprite.cli import runs as cli_runs

    run = _trail(tmp_path / "r", "", T0, 2.0, "success")
    assert "goodput 70.0%" in cli_runs.show(run)
    assert json.loads(cli_runs.show(run, json_out=True))["goodput"]["goodput"] == pytest.approx(0.7, abs=1e-3)


def test_the_timeline_plot_is_a_new_png_with_every_stretch_and_mark(tmp_path):
    records = [*attempt(1, T0, 15.0, "application fault", 10.0, [(8, 12.0, 0.5, True)]),
               *attempt(2, T0 + 20, 15.0, "success", 10.0)]
    beats = {1: [beat(14, T0 + 13.5)], 2: [beat(24, T0 + 34.0, heartbeat.DONE)]}
    got = {(row, category, round(a, 3), round(b, 3)) for _, row, a, b, category in cli_goodput.spans([(records, beats)])}
    assert got == {(0, "other", 0.0, 10.0), (0, "productive", 10.0, 12.0), (0, "lost_work", 12.0, 13.5),
                   (0, "other", 13.5, 15.0), (0, "checkpoint_stall", 11.5, 12.0), (0, "checkpoint", 12.0, 12.0),
                   (0, "failure", 15.0, 15.0), (1, "restart", 20.0, 30.0), (1, "productive", 30.0, 34.0),
                   (1, "other", 34.0, 35.0)}
    pytest.importorskip("matplotlib")
    run = _trail(tmp_path / "r", "", T0, 2.0, "success")
    target = tmp_path / "t.png"
    assert cli_goodput.plot([str(run), str(target)]) == f"wrote {target}"
    assert target.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for bad in ([str(run), str(target)], [str(run), str(tmp_path / "t.jpg")], [str(target)]):
        with pytest.raises(UsageError):
            cli_goodput.plot(bad)


def test_auto_recomputes_the_interval_only_when_the_save_stall_changes_by_more_than_half(monkeypatch):
    from sprite.runtime import trail
    from sprite.runtime.ckpt import cadence

    seen = []
    monkeypatch.setattr(trail, "audit", lambda kind, **fields: seen.append((kind, fields)))
    monkeypatch.setattr(trail, "say", lambda message: None)
    hook = cadence.Cadence({"SPRITE_RUN_DIR": "x", "SPRITE_CHECKPOINT_EVERY": "auto", "SPRITE_MTBF": "7200"})
    for stall in (2.0, 2.9, 1.1, 3.5, 0.5):
        hook._retune(stall)
    assert [f["save_seconds"] for _, f in seen] == [2.0, 3.5, 0.5]
    assert all(kind == "checkpoint_interval" and f["seconds"] == pytest.approx(math.sqrt(2 * f["save_seconds"] *
               7200), rel=1e-3) and f["mtbf_hours"] == 2.0 for kind, f in seen)
    assert hook.interval == pytest.approx(math.sqrt(2 * 0.5 * 7200))


def test_a_site_profile_gives_the_mtbf(tmp_path):
    profile = tmp_path / "site.yaml"
    profile.write_text("name: mysite\ndescription: t\nscheduler: none\njob:\n  mtbf: 12h\n")
    script = tmp_path / "t.py"
    script.write_text("")
    done = subprocess.run([sys.executable, "-m", "sprite", "run", "--dry-run", "--json", "--site", str(profile),
                           "--checkpoint-every", "auto", str(script)], capture_output=True, text=True, cwd=tmp_path,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["env"]["SPRITE_MTBF"] == "43200.0"


def test_a_pbs_requeue_under_a_new_job_id_is_linked_through_the_requeue_answer(tmp_path):
    _trail(tmp_path / "a", "100.pbs", T0, 2.0, "preemption", "pbs", answer="101.pbs")
    _trail(tmp_path / "b", "101.pbs", T0 + 50, 3.0, "preemption", "pbs", answer="102.pbs")
    _trail(tmp_path / "c", "102.pbs", T0 + 90, 3.0, "success", "pbs")
    _trail(tmp_path / "d", "103.pbs", T0 + 99, 3.0, "success", "pbs")
    for name in "abc":
        assert [p.name for p in goodput.job_runs(tmp_path / name)] == ["a", "b", "c"]
    assert [p.name for p in goodput.job_runs(tmp_path / "d")] == ["d"]


def test_the_ranks_agree_about_twenty_times_an_interval_at_the_same_steps(monkeypatch):
    from types import SimpleNamespace

    from sprite.runtime.ckpt import cadence

    assert cadence.spacing(0.0, 0.1) == 1 and cadence.spacing(2.0, 0.25) == 1
    assert cadence.spacing(1800.0, 1.0) == 90 and cadence.spacing(86400.0, 0.001) == cadence.MAX_SPACING
    hook = cadence.Cadence({"SPRITE_RUN_DIR": "x", "SPRITE_CHECKPOINT_EVERY": "20"})
    agreed = []
    monkeypatch.setattr(hook, "_agree", lambda trainer, due, step, interval: agreed.append(trainer.global_step)
                        or (False, 0.1, 20.0))
    monkeypatch.setattr(cadence.trail, "audit", lambda kind, **fields: None)
    trainer = SimpleNamespace(global_step=0, is_global_zero=True, world_size=2)
    hook.on_train_batch_start(trainer, None, None, 0)
    for step in range(1, 40):
        trainer.global_step = step
        hook.on_train_batch_end(trainer, None, None, None, step)
        hook.on_train_batch_end(trainer, None, None, None, step)  # no optimizer step: no check
    assert agreed == [1, 11, 21, 31]  # 20 s / (20 x 0.1 s) = every 10 steps after the first


def test_keep_removes_only_this_runs_own_clock_checkpoints_once_the_newer_is_sealed(tmp_path, monkeypatch):
    """docs/long-runs.md: --keep N keeps the newest N clock checkpoints of this run (this attempt's, and those the
    audit trail records earlier attempts sealed); nothing else in the folder is removed: not the script's own
    checkpoints, not a preemption save, not another run's clock checkpoint of the same name pattern, and not an
    earlier attempt's save the trail names in another folder or as unsealed."""
    from types import SimpleNamespace

    from sprite import integrity
    from sprite.integrity import audit
    from sprite.runtime.ckpt import cadence, durable

    run, ck, other = tmp_path / "run", tmp_path / "ck", tmp_path / "elsewhere"
    for folder in (run, ck, other):
        folder.mkdir()

    def saved(path: Path) -> str:
        integrity.write_new(path, path.name.encode())
        integrity.seal(path, {"step": 1})
        return str(path)

    earlier = [saved(ck / f"sprite-every-step={step}.ckpt") for step in (2, 4)]
    unsealed, away = saved(ck / "sprite-every-step=5.ckpt"), saved(other / "sprite-every-step=3.ckpt")
    foreign = [saved(ck / name) for name in ("epoch=0-step=1.ckpt", "preempted-7.ckpt", "last.ckpt",
                                             "sprite-every-step=999.ckpt")]
    # the trail records every sealed save of the run, the script's own ModelCheckpoint saves too
    for path, verified in ((foreign[0], True), (earlier[0], True), (away, True), (earlier[1], True),
                           (unsealed, False)):
        audit.append(run / "audit.jsonl", "checkpoint_written", path=path, step=1, verified=verified)
    monkeypatch.setenv("SPRITE_RUN_DIR", str(run))
    hook = cadence.Cadence({"SPRITE_RUN_DIR": str(run), "SPRITE_CHECKPOINT_EVERY": "20", "SPRITE_KEEP": "1"})
    trainer = SimpleNamespace(is_global_zero=True)
    for step in (6, 8):
        hook.mine.append(saved(ck / f"sprite-every-step={step}.ckpt"))
        hook._prune(trainer)
    assert durable.drain(60)
    left = sorted(path.name for path in ck.iterdir() if not path.name.endswith(integrity.MANIFEST_SUFFIX))
    assert left == sorted(["sprite-every-step=8.ckpt", "sprite-every-step=5.ckpt",
                           *(Path(path).name for path in foreign)])
    assert all(integrity.verify(Path(path)).valid for path in [*foreign, away, ck / "sprite-every-step=8.ckpt"])
    assert not any(os.path.lexists(integrity.manifest_path(Path(path))) for path in earlier)


def test_a_clock_checkpoint_never_replaces_one_this_run_did_not_save(tmp_path, monkeypatch):
    """A second run in the same folder (--resume never) reaching the step of another run's clock checkpoint saves
    beside it (-v1, -v2), not over it; a name this run saved itself (an earlier attempt, per its audit trail) is
    reused."""
    from types import SimpleNamespace

    from sprite import integrity
    from sprite.integrity import audit
    from sprite.runtime.ckpt import cadence

    run, ck = tmp_path / "run", tmp_path / "ck"
    run.mkdir(), ck.mkdir()
    for name in ("sprite-every-step=1.ckpt", "sprite-every-step=1-v1.ckpt", "sprite-every-step=3.ckpt"):
        integrity.write_new(ck / name, b"another run's")
    monkeypatch.setenv("SPRITE_RUN_DIR", str(run))
    audit.append(run / "audit.jsonl", "checkpoint_written", path=str(ck / "sprite-every-step=3.ckpt"), step=3,
                 verified=True)  # saved by an earlier attempt of this run
    hook = cadence.Cadence({"SPRITE_RUN_DIR": str(run), "SPRITE_CHECKPOINT_EVERY": "20"})
    trainer = SimpleNamespace(is_global_zero=True, world_size=1, global_step=1)
    assert hook._name(trainer, ck) == str(ck / "sprite-every-step=1-v2.ckpt")
    trainer.global_step = 2
    assert hook._name(trainer, ck) == str(ck / "sprite-every-step=2.ckpt")
    trainer.global_step = 3
    assert hook._name(trainer, ck) == str(ck / "sprite-every-step=3.ckpt")
    told = []
    ranks = SimpleNamespace(is_global_zero=False, world_size=2, global_step=1,
                            strategy=SimpleNamespace(broadcast=lambda value: told.append(value) or "rank 0's"))
    assert hook._name(ranks, ck) == "rank 0's" and told == [None]  # the other ranks take rank 0's pick
    # a damaged trail on rank 0 must not raise before the broadcast the other ranks wait in: no name is ours
    (run / "audit.jsonl").write_text("{not json\n")
    trainer.global_step = 3
    assert hook._name(trainer, ck) == str(ck / "sprite-every-step=3-v1.ckpt")


def test_a_preemption_checkpoint_goes_beside_another_runs_of_the_same_step(tmp_path):
    from types import SimpleNamespace

    from sprite import integrity
    from sprite.runtime.ckpt.seal import free_name

    integrity.write_new(tmp_path / "preempted-epoch=0-step=7.ckpt", b"another run's")
    trainer = SimpleNamespace(is_global_zero=True, world_size=1)
    base = str(tmp_path / "preempted-epoch=0-step=7")
    assert free_name(trainer, base) == base + "-v1.ckpt"
    fresh = str(tmp_path / "preempted-epoch=0-step=8")
    assert free_name(trainer, fresh) == fresh + ".ckpt"
