"""Planning a run's attempts (torch-free, no processes): the run folder, spare nodes, excluding a failed host,
resuming, the watchdog settings, and a launcher that says 0 for a run that did not finish."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sprite import contract
from sprite.contract import heartbeat
from sprite.recovery import rundir
from sprite.errors import UsageError
from sprite.contract.heartbeat import Beat
from sprite.recovery import attempt, classify, entry

SLURM = {"SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "nid[001-003]", "SLURM_NTASKS_PER_NODE": "2"}


@pytest.fixture
def script(tmp_path) -> str:
    path = tmp_path / "train.py"
    path.write_text("print('hi')\n")
    return str(path)


def prepare(script, tmp_path, environ=None, **flags):
    return entry.prepare({"script": script, **flags}, None, str(tmp_path / "run"), environ or {})


def test_the_first_plan_carries_the_run_folder_and_nothing_is_created(script, tmp_path):
    run, plan = prepare(script, tmp_path, stall_timeout="60")
    assert plan.env[contract.RUN_DIR] == str(tmp_path / "run") and plan.env[contract.ATTEMPT] == "1"
    assert plan.env[contract.HEARTBEAT_SECONDS] == "6" and plan.env[contract.RESUME] == "never"
    assert not (tmp_path / "run").exists()
    rundir.create(run.path)
    assert oct(run.path.stat().st_mode & 0o777) == "0o700" and (run.path / "heartbeat").is_dir()
    with pytest.raises(UsageError, match="exists already"):
        prepare(script, tmp_path)  # never into an existing run folder
    default = rundir.choose(None, "12.pbs01")
    assert default.parent == Path(os.getcwd()) / "sprite-runs" and "-12-" in default.name


def test_spare_nodes_stay_out_of_the_first_launch_and_replace_a_failed_host(script, tmp_path):
    run, plan = prepare(script, tmp_path, SLURM, spare_nodes="1")
    assert plan.world.hosts == ("nid001", "nid002")
    nxt, flags, where = run.next_plan(plan, run.flags, 2, ("nid001",))
    assert nxt.world.hosts == ("nid002", "nid003") and where == "without nid001"
    assert nxt.env[contract.MASTER_ADDR] == "nid002" and nxt.env[contract.ATTEMPT] == "2"
    assert nxt.env[contract.RESUME] == "auto"
    again, _, where = run.next_plan(nxt, flags, 3, ("nid002",))  # no spare left: same hosts, said why
    assert again.world.hosts == ("nid002", "nid003") and where.startswith("on the same hosts (nid002 cannot be")
    with pytest.raises(UsageError, match="--spare-nodes 3 leaves 0 of the 3"):
        prepare(script, tmp_path, SLURM, spare_nodes="3")
    with pytest.raises(UsageError, match="--spare-nodes 2"):
        prepare(script, tmp_path, SLURM, spare_nodes="2", nodes="2")


def test_sprites_own_run_variables_cannot_be_set_by_hand(script, tmp_path):
    with pytest.raises(UsageError, match="--env: SPRITE_RUN_DIR is set by sprite itself .* --run-dir DIR"):
        prepare(script, tmp_path, env={contract.RUN_DIR: str(tmp_path)})


def test_relaunches_resume_unless_the_user_said_never(script, tmp_path):
    run, plan = prepare(script, tmp_path)
    assert plan.env[contract.RESUME] == "never" and not run.keep_never  # the default: as the script would start
    assert run.next_plan(plan, run.flags, 2, ())[0].env[contract.RESUME] == "auto"
    run, plan = prepare(script, tmp_path, resume="never")
    assert run.keep_never and run.next_plan(plan, run.flags, 2, ())[0].env[contract.RESUME] == "never"
    spec = tmp_path / "job.yaml"
    spec.write_text("script: train.py\nresume: never\n")
    run, plan = entry.prepare({}, str(spec), str(tmp_path / "run2"), {})
    assert run.keep_never
    run, plan = entry.prepare({"resume": "auto"}, str(spec), str(tmp_path / "run3"), {})
    assert not run.keep_never and plan.env[contract.RESUME] == "auto"


@pytest.mark.parametrize("resume, starts", [("never", "starting from scratch (--resume never)."),
                                            (None, "starting from the last valid checkpoint.")])
def test_the_relaunch_line_says_where_the_next_attempt_starts(script, tmp_path, monkeypatch, capsys, resume, starts):
    """docs/long-runs.md: a relaunch says whether it resumes; under --resume never it starts from scratch (FAKE
    attempts: the first a node fault, the second a success)."""
    from sprite.recovery import loop

    run, plan = prepare(script, tmp_path, retries="1", **({"resume": resume} if resume else {}))
    verdicts = iter([classify.Verdict(classify.NODE_FAULT, "rank 1 was killed"),
                     classify.Verdict(classify.SUCCESS, "")])
    monkeypatch.setattr(attempt, "run_one", lambda run, plan, number, signals: (
        {"attempt": number, "exit_code": 0 if number == 2 else 137, "progressed": True}, next(verdicts)))
    monkeypatch.setattr(run, "record", lambda kind, **fields: None)
    assert loop.run_attempts(run, plan) == 0
    said = capsys.readouterr().err
    assert "relaunching on the same hosts as attempt 2 of 2, " + starts in said, said


def test_no_relaunch_follows_an_attempt_that_sprite_was_told_to_stop_during(script, tmp_path, monkeypatch):
    """A SIGTERM to sprite run while an attempt ends in a node fault: the retry policy would relaunch, but sprite
    was told to stop, so it does not (FAKE attempt; the signal is put where sprite's handler puts it)."""
    import signal

    from sprite.recovery import loop

    run, plan = prepare(script, tmp_path, retries="2")
    records = []

    def one_attempt(run, plan, number, signals):
        signals.received.append(signal.SIGTERM)
        return {"attempt": number, "exit_code": 143, "progressed": True}, classify.Verdict(classify.NODE_FAULT, "x")

    monkeypatch.setattr(attempt, "run_one", one_attempt)
    monkeypatch.setattr(run, "record", lambda kind, **fields: records.append((kind, fields.get("next"))))
    assert loop.run_attempts(run, plan) == 143
    assert records == [("attempt_end", "stop: sprite was told to stop")]


def test_watchdog_settings_from_flags_spec_and_site(script, tmp_path):
    run, _ = prepare(script, tmp_path, stall_timeout="30", save_timeout="90")
    assert (run.limits.stall, run.limits.first_step, run.limits.save) == (30, 300, 90)
    assert prepare(script, tmp_path)[0].limits is None
    with pytest.raises(UsageError, match="^--first-step-timeout 100.0 needs a stall timeout"):
        prepare(script, tmp_path, first_step_timeout="100")
    # An allowance shorter than the stall timeout was raised to it without a word (600/600/600).
    with pytest.raises(UsageError) as refused:
        prepare(script, tmp_path, stall_timeout="600", first_step_timeout="60", save_timeout="30")
    assert refused.value.exit_code == 2
    assert str(refused.value).startswith("--first-step-timeout 60.0 and --save-timeout 30.0 are shorter than the "
                                         "stall timeout (--stall-timeout 600.0).")
    with pytest.raises(UsageError, match=r"^--save-timeout 30.0 is shorter than the stall timeout \(--stall-timeout 60"):
        prepare(script, tmp_path, stall_timeout="60", save_timeout="30")
    # the stall timeout of a site profile: the refusal names the profile's line, not a flag never typed
    with pytest.raises(UsageError, match=r"^--first-step-timeout 600.0 is shorter than the stall timeout \(.*aurora"
                                         r".yaml:\d+: key 'job.stall_timeout' = 1800"):
        prepare(script, tmp_path, site="aurora", first_step_timeout="600")
    assert prepare(script, tmp_path, stall_timeout="60", first_step_timeout="60")[0].limits.first_step == 60
    with pytest.raises(UsageError, match="--stall-timeout: 'soon' is not a positive number of seconds"):
        prepare(script, tmp_path, stall_timeout="soon")
    # 1e308 passed planning and then made the run record's JSON fail (10 x 1e308 is inf), with a traceback
    with pytest.raises(UsageError, match="--stall-timeout: '1e308' seconds is more than ten years"):
        prepare(script, tmp_path, stall_timeout="1e308")
    with pytest.raises(UsageError, match="--checkpoint-every: '999999999999d' is more than ten years"):
        prepare(script, tmp_path, checkpoint_every="999999999999d")
    aurora, _ = prepare(script, tmp_path, site="aurora")
    assert aurora.limits.stall == 1800  # the site profile's default (conf/aurora.yaml)
    spec = tmp_path / "job.yaml"
    spec.write_text("script: train.py\nstall_timeout: 45\nretries: 2\n")
    run, _ = entry.prepare({}, str(spec), str(tmp_path / "run2"), {})
    assert (run.limits.stall, run.retries) == (45, 2)


def test_a_launcher_that_says_0_for_an_unfinished_rank_fails_the_attempt(tmp_path, capsys):
    beats = {0: Beat(0, "a", 1, 8, heartbeat.DONE, 9, 0.0, 0), 1: Beat(1, "b", 2, 5, heartbeat.TRAINING, 6, 0.0, 0)}
    log = tmp_path / "attempt-1.log"
    log.write_text("all good\n")

    class Plan:  # the two fields _verdict reads
        world = type("W", (), {"hosts": ("a", "b"), "devices": 1})()

    code, verdict = attempt._verdict(0, log, Plan, beats)
    assert code == 1 and verdict.cause == classify.APP_FAULT
    assert verdict.reason == "the launcher exited 0 while rank 1 on b in training step at step 5"
    assert "sprite: error: the launcher exited 0, but the run did not finish" in capsys.readouterr().err
    finished = {rank: Beat(rank, "a", 1, 8, heartbeat.DONE, 9, 0.0, 0) for rank in (0, 1)}
    assert attempt._verdict(0, log, Plan, finished) == (0, classify.Verdict(classify.SUCCESS, "every rank finished"))


def test_a_requeued_slurm_job_is_recorded_as_such(script, tmp_path):
    from sprite import schedulers
    from sprite.integrity import audit

    assert schedulers.get("slurm").restart_count({"SLURM_RESTART_COUNT": "2"}) == 2
    assert schedulers.get("pbs").restart_count({"SLURM_RESTART_COUNT": "2"}) == 0
    run, plan = prepare(script, tmp_path, {**SLURM, "SLURM_RESTART_COUNT": "1"})
    rundir.create(run.path)
    entry._launch_record(run, plan)
    kinds = [(r["kind"], r.get("restart_count")) for r in audit.read(run.trail)]
    assert kinds == [("launch", None), ("requeue", 1)]


def test_the_recorded_command_line_shows_no_env_value():
    argv = ["sprite", "run", "--env", "WANDB_API_KEY=abc", "--env=HF_TOKEN=xyz", "--env", "PASSED", "train.py"]
    assert entry.masked_argv(argv) == ["sprite", "run", "--env", "WANDB_API_KEY=***", "--env=HF_TOKEN=***", "--env",
                                       "PASSED", "train.py"]
