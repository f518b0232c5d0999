"""The stall watchdog's decisions (pure) and the heartbeat files both halves share."""

from __future__ import annotations

import os

from sprite.contract import heartbeat
from sprite.contract.heartbeat import Beat
from sprite.recovery.watchdog import Limits, Watch, heartbeat_seconds, ranges, summarize, suspects


def beat(rank, step, phase=heartbeat.TRAINING, host="h1", count=1, first_step=0):
    return Beat(rank, host, 100 + rank, step, phase, count, 0.0, first_step)


def test_limits_defaults_and_floors():
    assert Limits.from_options(30) == Limits(30, 300, 60)
    assert Limits.from_options(100) == Limits(100, 1000, 200)
    assert Limits.from_options(30, first_step=5, save=10) == Limits(30, 30, 30)  # never shorter than the stall
    assert Limits.from_options(5, first_step=120, save=7) == Limits(5, 120, 7)


def test_heartbeat_interval_is_a_tenth_of_the_timeout_within_bounds():
    assert heartbeat_seconds(None) == 30.0
    assert heartbeat_seconds(Limits.from_options(4)) == 0.5
    assert heartbeat_seconds(Limits.from_options(60)) == 6.0
    assert heartbeat_seconds(Limits.from_options(1800)) == 30.0


def test_sprite_reads_the_heartbeats_as_docs_long_runs_says(tmp_path):
    """Every 15 s without --stall-timeout; with one, every twentieth of it, between 0.25 s and 15 s."""
    from types import SimpleNamespace

    from sprite.recovery.attempt import Watcher

    def poll(limits):
        return Watcher(SimpleNamespace(limits=limits), tmp_path, 2).poll

    assert poll(None) == 15.0
    assert poll(Limits.from_options(60)) == 3.0 and poll(Limits.from_options(2)) == 0.25
    assert poll(Limits.from_options(600)) == 15.0 and poll(Limits.from_options(3600)) == 15.0


def test_summary_groups_ranks_by_phase_and_step():
    beats = {0: beat(0, 3, heartbeat.SAVE), **{r: beat(r, 4) for r in (1, 2, 3)}}
    assert summarize(beats, 4) == ("rank 0 on h1 in checkpoint save at step 3; "
                                   "ranks 1-3 on h1 in training step at step 4")
    beats = {0: beat(0, 7, host="nid001"), 1: beat(1, 7, host="nid002"), 3: beat(3, 6, heartbeat.VALIDATION, "nid002")}
    assert summarize(beats, 5) == ("ranks 0-1 on nid[001-002] in training step at step 7; rank 3 on nid002 in "
                                   "validation at step 6; ranks 2,4 never reported (no heartbeat)")
    assert ranges([5, 0, 1, 2, 9, 10]) == "0-2,5,9-10"


def aurora_hosts(count: int) -> list[str]:
    """Aurora-style names (x1234c5s6b0n0) scattered over the machine, so that no host list folds them short."""
    import random

    pick = random.Random(7)
    names = set()
    while len(names) < count:
        names.add(f"x{pick.randrange(1000, 5000)}c{pick.randrange(8)}s{pick.randrange(8)}b0n{pick.randrange(2)}")
    return sorted(names)


def test_a_large_worlds_stall_line_is_bounded_and_its_suspect_host_still_relaunches(tmp_path):
    """256 hosts of 12 ranks, one host a step behind: the stall line stays short with its cause before the summary,
    and the verdict takes the suspect host from the watchdog's Stall, not from the printed line, so --retries
    relaunches without that host (the line was cut at errors.MAX_MESSAGE before the cause, and nothing relaunched)."""
    from types import SimpleNamespace

    from sprite.errors import MAX_MESSAGE, SpriteError, report
    from sprite.recovery import attempt, classify, policy

    hosts = aurora_hosts(256)
    late = hosts[200]
    beats = {h * 12 + j: beat(h * 12 + j, 36 if host == late else 37, host=host)
             for h, host in enumerate(hosts) for j in range(12)}
    watch = Watch(Limits.from_options(30), len(beats), started=0.0)
    assert watch.observe(beats, 1.0) is None
    stall = watch.observe(beats, 40.0)
    assert stall.suspect_hosts == (late,)
    line = report(SpriteError(stall.message()))
    assert len(line) < 1000 and "more characters cut" not in line, line
    assert line.index(f"suspect hosts: {late}") < line.index("raise --stall-timeout") < line.index("Where the ranks")
    assert "ranks 0-2399,2412-3071 on 255 hosts (" in stall.summary and f"ranks 2400-2411 on {late} " in stall.summary

    log = tmp_path / "attempt-1.log"
    cut = line.replace(f"suspect hosts: {late}", "suspect hosts: " + ",".join(hosts))  # as if cut past MAX_MESSAGE
    log.write_text(cut[:MAX_MESSAGE] + " ... (1000 more characters cut)\n")
    plan = SimpleNamespace(world=SimpleNamespace(hosts=hosts, devices=12))
    code, verdict = attempt._verdict(124, log, plan, beats, stall)
    assert (code, verdict.cause, verdict.hosts) == (124, classify.STALL, (late,))
    decision = policy.decide(verdict, 1, 2, True)
    assert decision.relaunch and decision.exclude == (late,)


def test_the_summary_shows_a_few_groups_and_counts_the_rest():
    beats = {r: beat(r, r, host=f"n{r:03d}") for r in range(30)}  # thirty ranks, each at its own step
    text = summarize(beats, 40)
    assert text.count(";") == 8 and text.endswith("; 23 more groups (32 ranks)"), text
    scattered = {r: beat(r, 5 if r % 3 else 4, host="h1") for r in range(3000)}
    text = summarize(scattered, 3000)
    assert len(text) < 400 and "(2000 ranks) on h1 in training step at step 5" in text, text


def test_suspects_are_hosts_whose_ranks_all_fell_behind_in_training():
    behind = {0: beat(0, 37, host="a"), 1: beat(1, 37, host="a"), 2: beat(2, 36, host="b"), 3: beat(3, 36, host="b")}
    assert suspects(behind, 4) == ("b",)
    same_step = {r: beat(r, 37, host="ab"[r // 2]) for r in range(4)}
    assert suspects(same_step, 4) == ()  # every rank stopped at one step: the script's own hang
    shared = {0: beat(0, 37, host="a"), 1: beat(1, 36, host="a")}
    assert suspects(shared, 2) == ()  # the laggard shares its host with a rank that kept up
    saving = {0: beat(0, 3, heartbeat.SAVE, host="a"), 1: beat(1, 4, host="b")}
    assert suspects(saving, 2) == ()  # a save under a rank-zero guard is the script's collective, not the node
    assert suspects({0: beat(0, 3, host="a")}, 2) == ()  # a silent rank has no known host


def test_watch_uses_the_first_step_allowance_then_the_stall_timeout():
    limits = Limits(stall=5, first_step=60, save=20)
    watch = Watch(limits, world_size=2, started=0.0)
    starting = {0: beat(0, 0, heartbeat.START, first_step=-1), 1: beat(1, 0, heartbeat.START, first_step=-1)}
    assert watch.observe({}, 10.0) is None
    assert watch.observe(starting, 20.0) is None  # a first heartbeat is progress
    assert watch.observe(starting, 79.0) is None  # start-up may take a minute
    stall = watch.observe(starting, 80.5)
    assert stall and stall.allowance == "first-step allowance" and stall.limit == 60
    assert "ranks 0-1 on h1 in start-up at step 0" in stall.message()

    watch = Watch(limits, world_size=2, started=0.0)
    for now, step in ((1.0, 0), (2.0, 1), (3.0, 2)):
        assert watch.observe({r: beat(r, step, count=step + 1) for r in (0, 1)}, now) is None
    assert watch.progressed
    assert watch.observe({r: beat(r, 2, count=3) for r in (0, 1)}, 7.9) is None
    stall = watch.observe({r: beat(r, 2, count=3) for r in (0, 1)}, 8.1)
    assert stall and stall.allowance == "stall timeout" and round(stall.idle, 1) == 5.1
    assert stall.message().startswith("Stopped the run: no rank advanced for 5 s (stall timeout 5 s). The usual")
    assert stall.message().endswith("Where the ranks were: ranks 0-1 on h1 in training step at step 2.")


def test_watch_gives_a_save_the_save_allowance_and_any_rank_progress_resets_the_clock():
    watch = Watch(Limits(stall=5, first_step=60, save=20), world_size=2, started=0.0)
    watch.observe({0: beat(0, 1, count=2), 1: beat(1, 1, count=2)}, 1.0)
    saving = {0: beat(0, 1, heartbeat.SAVE, count=3), 1: beat(1, 1, count=2)}
    assert watch.observe(saving, 2.0) is None
    assert watch.observe(saving, 21.9) is None
    stall = watch.observe(saving, 22.1)
    assert stall and stall.allowance == "save allowance"
    assert stall.summary == "rank 0 on h1 in checkpoint save at step 1; rank 1 on h1 in training step at step 1"
    watch = Watch(Limits(stall=5, first_step=5, save=5), world_size=2, started=0.0)
    for now in range(1, 30):  # only rank 1 moves (validation batches): still progress
        assert watch.observe({0: beat(0, 2), 1: beat(1, 2, heartbeat.VALIDATION, count=now)}, float(now)) is None


def test_a_world_that_is_done_gets_the_exit_allowance_and_a_rank_still_training_does_not():
    watch = Watch(Limits(stall=5, first_step=60, save=20), world_size=2, started=0.0)
    watch.observe({r: beat(r, 3, count=4) for r in (0, 1)}, 1.0)
    done = {r: beat(r, 3, heartbeat.DONE, count=5) for r in (0, 1)}
    assert watch.observe(done, 2.0) is None
    assert watch.observe(done, 61.9) is None  # slow to leave under load: not a stall
    stall = watch.observe(done, 62.1)
    assert stall and stall.allowance == "exit allowance" and stall.limit == 60
    watch = Watch(Limits(stall=5, first_step=60, save=20), world_size=2, started=0.0)
    watch.observe({r: beat(r, 3, count=4) for r in (0, 1)}, 1.0)
    half = {0: beat(0, 3, heartbeat.DONE, count=5), 1: beat(1, 3, count=4)}
    assert watch.observe(half, 2.0) is None
    stall = watch.observe(half, 7.1)  # rank 0 left the loop while rank 1 is stuck in it: a stall
    assert stall and stall.allowance == "stall timeout"
    assert watch.observe({0: beat(0, 3, heartbeat.DONE, count=5)}, 7.2).allowance == "stall timeout"  # one silent


def test_a_watch_without_limits_only_follows_progress():
    watch = Watch(None, world_size=1, started=0.0)
    assert watch.observe({0: beat(0, 0, first_step=-1)}, 1e6) is None and not watch.progressed
    assert watch.observe({0: beat(0, 3, count=5)}, 2e6) is None and watch.progressed


def test_heartbeat_files_round_trip_and_skip_damaged_ones(tmp_path):
    assert heartbeat.read_all(tmp_path / "missing") == {}
    one = beat(1, 12, heartbeat.VALIDATION, host="nid7", count=40, first_step=3)
    heartbeat.write(tmp_path, one)
    heartbeat.write(tmp_path, beat(0, 12))
    (tmp_path / "rank5.json").write_text('{"rank": 5, "host"')  # torn: skipped, not an error
    (tmp_path / "notes.txt").write_text("ignored")
    seen = heartbeat.read_all(tmp_path)
    assert set(seen) == {0, 1} and seen[1] == one and one.past_first_step
    assert sorted(os.listdir(tmp_path)) == ["notes.txt", "rank0.json", "rank1.json", "rank5.json"]  # no temp left
    assert heartbeat.folder_from_env({"SPRITE_RUN_DIR": "/r", "SPRITE_ATTEMPT": "2"}) == \
        heartbeat.folder("/r", 2) and str(heartbeat.folder("/r", 2)) == "/r/heartbeat/attempt-2"
    assert heartbeat.folder_from_env({}) is None
    assert heartbeat.folder_from_env({"SPRITE_RUN_DIR": "/r"}) is None  # a run folder without sprite run's attempt


def test_a_rank_that_fails_writes_its_last_step_before_it_exits(tmp_path):
    """docs/long-runs.md: steps are written by a background thread at most every interval, and a rank that exits
    (a failing one too) writes the step that thread had not written yet (beats.Heart at exit), so goodput's lost
    work is measured to the rank's real last step."""
    import subprocess
    import sys

    code = ("import sys\n"
            "from pathlib import Path\n"
            "from sprite.contract import heartbeat\n"
            "from sprite.runtime.beats import Heart\n"
            "heart = Heart(Path(sys.argv[1]), 0, 3600.0)\n"  # the thread would not write for an hour
            "heart.update(phase=heartbeat.TRAINING, step=1)\n"  # a phase change: written at once
            "heart.update(step=7)\n"
            "raise ValueError('the script fails')\n")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "the script fails" in done.stderr
    beat = heartbeat.read_all(tmp_path)[0]
    assert (beat.phase, beat.step, beat.first_step) == (heartbeat.TRAINING, 7, 1)


def test_a_silent_start_names_sprite_beat_and_a_stalled_step_names_the_collective():
    """docs/scripts.md: a script stopped by the first-step allowance gets a stop line naming sprite.beat."""
    from sprite.recovery.watchdog import Stall

    first = Stall(301.0, 300.0, "first-step allowance", "rank 0: no step").message()
    assert "sprite.beat(step)" in first and "first-step allowance 300 s" in first
    stalled = Stall(61.0, 60.0, "stall timeout", "rank 0 at step 3").message()
    assert "sprite.beat" not in stalled and "collective" in stalled


def test_the_stop_line_names_the_option_that_sets_the_limit_that_applied():
    """A save stopped by the save allowance is lengthened with --save-timeout, start-up with --first-step-timeout,
    and leaving (the exit allowance, as long as the first-step one) has a cause of its own."""
    from sprite.recovery.watchdog import Stall

    said = {allowance: Stall(61.0, 60.0, allowance, "rank 0 at step 3").message()
            for allowance in ("stall timeout", "first-step allowance", "save allowance", "exit allowance")}
    assert "raise --stall-timeout if a step really takes this long" in said["stall timeout"]
    assert "raise --first-step-timeout if start-up really takes this long" in said["first-step allowance"]
    assert "raise --save-timeout if a save really takes this long" in said["save allowance"]
    assert "checkpoint save did not end" in said["save allowance"]
    assert "raise --first-step-timeout (it sets the exit allowance too) if leaving" in said["exit allowance"]
    assert "done with the script but the launch did not end" in said["exit allowance"]
    assert sum("--stall-timeout" in line for line in said.values()) == 1


def test_a_failed_rank_stops_the_launch_only_after_the_grace_with_or_without_a_stall_timeout():
    """recovery/watchdog.py FAILED_GRACE: counted from the first heartbeat that says a rank failed, whatever the
    stall limits (a run without --stall-timeout is stopped too); nothing while every rank is healthy."""
    from sprite.recovery.watchdog import FAILED_GRACE

    for limits in (None, Limits.from_options(3600)):
        watch = Watch(limits, 2, started=0.0)
        healthy = {0: beat(0, 5), 1: beat(1, 5)}
        assert watch.observe(healthy, 10.0) is None and watch.failure_overdue(healthy, 500.0) is None
        failed = {0: beat(0, 5, count=2), 1: beat(1, 5, heartbeat.FAILED, count=2)}
        assert watch.observe(failed, 20.0) is None
        assert watch.failure_overdue(failed, 20.0 + FAILED_GRACE) is None
        line = watch.failure_overdue(failed, 21.0 + FAILED_GRACE)
        assert line.startswith("Stopped the launch: rank(s) 1 failed 31 s ago"), line
        assert "rank 0 on h1 in training step at step 5; rank 1 on h1 failed at step 5" in line
        watch.observe({0: beat(0, 5, count=3), 1: beat(1, 5, heartbeat.FAILED, count=3)}, 40.0)
        assert watch.failed_at == 20.0  # the first report counts, not the latest


def test_a_failed_rank_is_never_taken_for_a_stall_however_short_the_stall_timeout():
    """With --stall-timeout under FAILED_GRACE, peers stuck beside a failed rank would pass the stall timeout
    first; the failure, not a stall (exit 124, never relaunched), is the attempt's cause."""
    from sprite.recovery.watchdog import FAILED_GRACE

    watch = Watch(Limits.from_options(5), 2, started=0.0)
    assert watch.observe({0: beat(0, 5), 1: beat(1, 5)}, 1.0) is None
    failed = {0: beat(0, 5), 1: beat(1, 5, heartbeat.FAILED, count=2)}
    assert watch.observe(failed, 2.0) is None
    assert watch.observe(failed, 2.0 + FAILED_GRACE) is None  # far past the 5 s stall timeout: still no stall
    assert watch.failure_overdue(failed, 3.0 + FAILED_GRACE).startswith("Stopped the launch: rank(s) 1 failed")
