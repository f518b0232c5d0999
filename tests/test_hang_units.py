"""Hang diagnosis without processes (issue 27): reading faulthandler's dumps, the phrase per rank, the culprit rules
on hand-written stacks, the dump times in the plan, and the rank-side dumper and flight recorder summary."""

from __future__ import annotations

import faulthandler
import json
import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from sprite import contract
from sprite.contract import stacks
from sprite.contract.heartbeat import Beat
from sprite.recovery import entry, hang
from sprite.recovery.hang import diagnose as dg
from sprite.recovery.hang import where as places
from sprite.recovery.hang.frames import Frame, parse
from sprite.recovery.watchdog import Limits

LIB = "/venv/lib/python3.11/site-packages"
HEADER = stacks.HEADER + json.dumps({"rank": 1, "host": "n1", "library": ["/py/lib/python3.11", LIB, "/venv/sprite"]})
MAIN_TAIL = ['  File "/work/train.py", line 90 in main', '  File "/work/train.py", line 95 in <module>',
             '  File "<frozen runpy>", line 88 in _run_code',
             '  File "/venv/sprite/runtime/__main__.py", line 143 in <module>']
BEAT_THREAD = ["Thread 0x00007f0000000001 (most recent call first):",
               '  File "/venv/sprite/runtime/beats.py", line 64 in _loop',
               '  File "/py/lib/python3.11/threading.py", line 1045 in _bootstrap_inner',
               '  File "/py/lib/python3.11/threading.py", line 1002 in _bootstrap', ""]


def dump(*inner: str, header: str = HEADER) -> str:
    """A stack file: the header, a heartbeat thread, then the main thread with ``inner`` frames on top."""
    main = ["Thread 0x00007f0000000002 (most recent call first):", *inner, *MAIN_TAIL]
    return "\n".join([header, "Timeout (0:00:04.800000)!", *BEAT_THREAD, *main]) + "\n"


def frame(path: str, line: int, func: str) -> str:
    return f'  File "{path}", line {line} in {func}'


SLEEP = (frame("/work/train.py", 57, "training_step"), frame(f"{LIB}/lightning/pytorch/core/module.py", 10, "step"))
C10D = f"{LIB}/torch/distributed/distributed_c10d.py"
WRAP = f"{LIB}/torch/distributed/c10d_logger.py"
ALL_REDUCE = (frame(C10D, 3252, "all_reduce"), frame(WRAP, 83, "wrapper"), frame("/work/train.py", 60, "training_step"),
              frame(f"{LIB}/lightning/pytorch/loops/loop.py", 5, "run"))
BACKWARD = (frame(f"{LIB}/torch/autograd/graph.py", 829, "_engine_run_backward"),
            frame(f"{LIB}/torch/autograd/__init__.py", 364, "backward"), frame(f"{LIB}/lightning/x.py", 3, "closure"))
HOOK_BARRIER = (frame(C10D, 5356, "barrier"), frame(WRAP, 83, "wrapper"),
                frame(f"{LIB}/lightning/fabric/utilities/distributed.py", 213, "_sync_ddp"),
                frame("/work/train.py", 70, "on_train_epoch_end"), frame(f"{LIB}/lightning/loops/fit.py", 9, "run"))
LOADER = (frame("/work/train.py", 40, "__getitem__"), frame(f"{LIB}/torch/utils/data/_utils/fetch.py", 52, "fetch"),
          frame(f"{LIB}/torch/utils/data/dataloader.py", 733, "__next__"))


def where_of(*inner: str, header: str = HEADER) -> places.Where:
    return places.of(parse(dump(*inner, header=header)), quote=lambda f: "time.sleep(3600)" if f.line == 57 else "")


# --- reading a dump ---

def test_the_main_thread_is_found_among_the_threads_and_the_header_is_read():
    found = parse(dump(*SLEEP))
    assert found.header["rank"] == 1 and found.dumped and len(found.threads) == 2
    main = found.main()
    assert main.frames[0] == Frame("/work/train.py", 57, "training_step") and main.frames[-1].func == "<module>"


def test_only_the_last_dump_counts_and_a_header_alone_is_no_dump():
    twice = dump(*ALL_REDUCE) + "Timeout (0:00:04)!\n" + "\n".join(
        ["Current thread 0x00007f0000000003 (most recent call first):", *SLEEP, "  <no Python frame>", *MAIN_TAIL])
    assert parse(twice).main().frames[0].func == "training_step"
    assert not parse(HEADER + "\n").dumped and parse("garbage\n\x00").header == {}


# --- one rank's phrase ---

def test_a_rank_in_its_own_code_is_named_with_its_function_and_line():
    where = where_of(*SLEEP)
    assert (where.kind, where.text) == (places.USER, "stuck in training_step (train.py:57: time.sleep(3600))")


def test_a_collective_is_named_with_its_caller_and_whether_the_users_code_called_it():
    direct = where_of(*ALL_REDUCE)
    assert (direct.kind, direct.op, direct.direct) == (places.COLLECTIVE, "all_reduce", True)
    assert direct.text == "waiting in all_reduce called from training_step (train.py:60)"
    hook = where_of(*HOOK_BARRIER)
    assert not hook.direct and hook.text == ("waiting in barrier called from _sync_ddp (distributed.py:213) under "
                                             "on_train_epoch_end (train.py:70)")


def test_backward_the_data_loader_and_library_code_are_told_apart():
    assert where_of(*BACKWARD).kind == places.BACKWARD
    loader = where_of(*LOADER)
    assert loader.kind == places.USER and loader.text == "stuck in __getitem__ (train.py:40) inside the data loader"
    assert where_of(*LOADER[1:]).text == "waiting for the data loader in fetch (fetch.py:52) under main (train.py:90)"
    library = where_of(frame(f"{LIB}/torch/serialization.py", 5, "load"))  # under the script's entry point only
    assert (library.kind, library.text) == (places.LIBRARY, "in load (serialization.py:5) under main (train.py:90)")
    assert where_of(frame(f"{LIB}/torch/serialization.py", 5, "load"), *SLEEP).text == (
        "stuck in training_step (train.py:57: time.sleep(3600)) in load (serialization.py:5)")
    assert places.of(parse(dump())).kind == places.USER
    assert places.of(None).kind == places.NONE


def test_without_a_header_site_packages_and_the_standard_library_are_library_code():
    where = where_of(frame("/usr/lib/python3.11/selectors.py", 415, "select"), *SLEEP, header="no header")
    assert where.text == "stuck in training_step (train.py:57: time.sleep(3600)) in select (selectors.py:415)"


def test_a_source_line_is_quoted_only_from_a_regular_file_and_cut(tmp_path):
    source = tmp_path / "t.py"
    source.write_text("a = 1\n    time.sleep(3600)   # long " + "x" * 80 + "\n")
    assert places.source_line(Frame(str(source), 2, "f"), limit=20) == "time.sleep(3600) ..."
    assert places.source_line(Frame(str(source), 9, "f")) == ""
    os.mkfifo(tmp_path / "fifo")
    assert places.source_line(Frame(str(tmp_path / "fifo"), 1, "f")) == ""  # never blocks
    assert places.source_line(Frame("relative.py", 1, "f")) == ""


def test_the_flight_recorder_summary_becomes_one_phrase_and_a_sequence_number():
    summary = {"backend": "gloo", "groups": [
        {"pg": "0", "name": "default_pg", "last_enqueued": 35, "last_completed": 34,
         "last": {"op": "all_reduce", "seq": 35, "sizes": [[161]], "completed": False}},
        {"pg": "1", "name": "side", "last_enqueued": 2, "last_completed": 2,
         "last": {"op": "broadcast", "seq": 2, "sizes": [[4, 4], [2]], "completed": True}}]}
    text, seq = places.collectives(summary)
    assert seq == 35
    assert text == ("all_reduce #35 (161) not completed (completed up to #34); broadcast #2 (4x4,2) on group side "
                    "completed")
    assert places.collectives({"backend": "xccl", "none": "no flight recorder on XCCL"}) == (
        "no flight recorder on XCCL", None)
    assert places.collectives(None) == ("", None) and places.collectives({"groups": "x"}) == ("", None)


# --- the culprit rules (diagnose.py's docstring, in its order) ---

def state(rank: int, kind: str, text: str = "", seq: int | None = None, direct: bool = False, host: str = "n1"):
    return dg.RankState(rank, host, places.Where(kind, text or kind, direct), f"#{seq}" if seq else "", seq)


def test_rule_0_the_ranks_still_in_the_script_when_others_finished_it():
    guarded = (frame(C10D, 3400, "broadcast_object_list"), frame(WRAP, 83, "wrapper"),
               frame(f"{LIB}/lightning/pytorch/strategies/model_parallel.py", 227, "broadcast"),
               frame(f"{LIB}/lightning/pytorch/trainer/trainer.py", 1400, "save_checkpoint"))
    saving = places.of(parse(dump(*guarded)), quote=lambda f: "trainer.save_checkpoint(path)" if f.line == 90 else "")
    assert saving.text == ("waiting in broadcast_object_list called from broadcast (model_parallel.py:227) under "
                           "main (train.py:90: trainer.save_checkpoint(path))")
    states = {0: dg.RankState(0, "n1", saving, pending=True),
              1: dg.RankState(1, "n1", places.Where(places.LIBRARY, "in _wait_count (finish.py:30)"), done=True)}
    found = dg.diagnose(states)
    assert found.culprits == (0,) and found.reason == "still in the script after the other ranks finished it"
    assert found.lines[1] == "rank 1 on n1: done with the script, in _wait_count (finish.py:30), for rank 0"
    states[0] = replace(states[0], done=True)
    assert dg.culprits(states) == (set(), "")  # every rank done: rule 0 does not apply


def test_rule_1_the_ranks_elsewhere_while_the_others_wait():
    states = {r: state(r, places.COLLECTIVE, "waiting in all_reduce") for r in range(4)}
    states[3] = state(3, places.USER, "stuck in training_step")
    assert dg.culprits(states) == ({3}, "not in a collective while the others wait in one")


def test_rule_1_counts_a_rank_with_an_unfinished_collective_as_waiting_whatever_its_stack():
    summary = {"groups": [{"pg": "0", "last_enqueued": 9, "last_completed": 8}]}
    assert places.pending(summary) and not places.pending({"groups": [{"last_enqueued": 8, "last_completed": 8}]})
    lagging = {"groups": [{"last_enqueued": 34, "last_completed": 33, "last": {"seq": 34, "completed": True}}]}
    assert not places.pending(lagging)  # the entry says completed: the group's counter lags (seen under srun)
    assert places.pending({"groups": [{"last_enqueued": 3, "last_completed": 3, "last": {"completed": False}}]})
    assert not places.pending({"none": "no recorder"}) and not places.pending(None)
    nccl = {0: dg.RankState(0, "n1", places.Where(places.LIBRARY, "in item (module.py:5)"), pending=True),
            1: dg.RankState(1, "n1", places.Where(places.USER, "stuck in training_step (train.py:57)"))}
    assert dg.culprits(nccl) == ({1}, "not in a collective while the others wait in one")
    assert dg.diagnose(nccl).lines[1] == "rank 0 on n1: in item (module.py:5), for rank 1"


def test_rule_2_the_ranks_behind_in_the_collectives():
    states = {0: state(0, places.BACKWARD, seq=12), 1: state(1, places.BACKWARD, seq=12),
              2: state(2, places.COLLECTIVE, "waiting in barrier", seq=11)}
    assert dg.culprits(states) == ({2}, "behind in the collectives (#11 where others reached #12)")


def test_rule_3_a_collective_only_some_ranks_called_from_their_own_code():
    states = {0: state(0, places.BACKWARD), 1: state(1, places.COLLECTIVE, "waiting in barrier", direct=True)}
    assert dg.culprits(states) == ({1}, "called a collective from its own code that the others did not reach")


def test_rule_4_the_one_smallest_group_and_rule_5_none():
    states = {r: state(r, places.USER, "stuck in read") for r in range(3)}
    states[3] = state(3, places.LIBRARY, "in load")
    assert dg.culprits(states) == ({3}, "the only ones in this place")
    assert dg.culprits({r: state(r, places.USER, "stuck in read") for r in range(3)}) == (set(), "")
    assert dg.culprits({0: state(0, places.USER, "a"), 1: state(1, places.USER, "b")}) == (set(), "")


def test_ranks_without_stacks_are_listed_but_never_judged():
    states = {0: state(0, places.COLLECTIVE, "waiting"), 1: state(1, places.NONE, "wrote no stacks")}
    assert dg.culprits(states) == (set(), "")
    assert [line.split(":")[0] for line in dg.diagnose(states).lines] == ["rank 0 on n1", "rank 1 on n1"]


def test_twelve_thousand_ranks_give_two_lines_with_the_culprit_first():
    states = {r: state(r, places.BACKWARD, "waiting in backward", host=f"n{r // 12:04d}") for r in range(12000)}
    states[7] = state(7, places.USER, "stuck in training_step (train.py:57)", host="n0000")
    found = dg.diagnose(states)
    assert found.culprits == (7,)
    culprit = ("rank 7 on n0000: stuck in training_step (train.py:57) <- the likely culprit: not in a collective "
               "while the others wait in one")
    assert found.lines == (culprit, "ranks 0-6,8-11999 on n[0000-0999]: waiting in backward, for rank 7")


def test_ranks_at_the_same_place_but_different_collectives_are_two_groups():
    """docs/hangs.md: ranks are grouped by where they are and what the flight recorder says of them."""
    states = {0: state(0, places.COLLECTIVE, "waiting in all_reduce", seq=7),
              1: state(1, places.COLLECTIVE, "waiting in all_reduce", seq=7),
              2: state(2, places.COLLECTIVE, "waiting in all_reduce", seq=8)}
    assert [[s.rank for s in group] for group in dg.groups(states)] == [[0, 1], [2]]


def test_ranks_that_print_alike_but_differ_for_the_culprit_rules_are_two_groups():
    """The recorder's phrase shows three process groups; a fourth one's unfinished collective makes rank 0 wait
    while rank 1, alike in print, is elsewhere: the culprit. They shared one line, which carried no culprit mark."""
    alike = places.Where(places.USER, "stuck in f (train.py:5)")
    states = {0: dg.RankState(0, "n1", alike, "a #1 completed; b #1 on group 1 completed", 4, pending=True),
              1: dg.RankState(1, "n1", alike, "a #1 completed; b #1 on group 1 completed", 4),
              **{r: state(r, places.COLLECTIVE, "waiting in all_reduce") for r in (2, 3)}}
    found = dg.diagnose(states)
    assert found.culprits == (1,)
    assert found.lines[0] == ("rank 1 on n1: stuck in f (train.py:5); collectives: a #1 completed; b #1 on group 1 "
                              "completed <- the likely culprit: not in a collective while the others wait in one")
    assert found.lines[1].startswith("rank 0 on n1: stuck in f (train.py:5)") and found.lines[1].endswith(", for rank 1")
    behind = {r: state(r, places.COLLECTIVE, "waiting in all_reduce", seq=9) for r in range(3)}
    behind[2] = replace(behind[2], seq=8)  # same phrase, another sequence number: rule 2 names it
    assert dg.diagnose(behind).lines[0].startswith("rank 2 on n1: waiting in all_reduce; collectives: #9 <- the likely")


def test_the_recorder_phrase_shows_unfinished_groups_first_and_counts_the_rest():
    def group(pg, done):
        return {"pg": pg, "name": f"g{pg}", "last_enqueued": 3, "last_completed": 3 if done else 2,
                "last": {"op": "all_reduce", "seq": 3, "sizes": [[1]], "completed": done}}

    text, _ = places.collectives({"groups": [group("0", True), group("1", True), group("2", True),
                                             group("3", False), group("4", True)]})
    assert text == ("all_reduce #3 (1) on group g3 not completed (completed up to #2); all_reduce #3 (1) completed; "
                    "all_reduce #3 (1) on group g1 completed; 2 more process groups")


def test_many_groups_are_cut_and_every_line_is_bounded():
    states = {r: state(r, places.USER, f"stuck in f{r} " + "x" * 900) for r in range(20)}
    found = dg.diagnose(states)
    assert len(found.lines) == dg.MAX_GROUPS + 1 and found.lines[-1] == "... and 12 more groups of ranks"
    assert all(len(line) < dg.LINE_MAX + 40 for line in found.lines)


# --- the plan, the files, the record ---

def test_the_plan_tells_the_ranks_when_to_dump_and_turns_the_recorder_on(tmp_path):
    script = tmp_path / "t.py"
    script.write_text("")
    _, plan = entry.prepare({"script": str(script), "stall_timeout": "6"}, None, str(tmp_path / "r1"), {})
    assert plan.env[contract.STACKS_AFTER] == "4.8,298.8,10.8"  # each limit less two heartbeat intervals (0.6 s)
    assert plan.env[stacks.RECORDER_BUFFER] == stacks.RECORDER_ENTRIES
    _, plan = entry.prepare({"script": str(script), "stall_timeout": "6"}, None, str(tmp_path / "r2"),
                            {stacks.RECORDER_BUFFER: "50"})
    assert stacks.RECORDER_BUFFER not in plan.env  # the user's own setting stays
    _, plan = entry.prepare({"script": str(script), "stall_timeout": "6"}, None, str(tmp_path / "r4"),
                            {stacks.RECORDER_OLD_BUFFER: "50"})
    assert stacks.RECORDER_BUFFER not in plan.env  # under its older name too
    for number, given in enumerate(({stacks.RECORDER_BUFFER: "50"}, {stacks.RECORDER_OLD_BUFFER: "7"})):
        flags = {"script": str(script), "stall_timeout": "6", "env": given}
        _, plan = entry.prepare(flags, None, str(tmp_path / f"e{number}"), {})  # given with --env
        assert {k: plan.env.get(k) for k in (stacks.RECORDER_BUFFER, stacks.RECORDER_OLD_BUFFER)} == {
            stacks.RECORDER_BUFFER: None, stacks.RECORDER_OLD_BUFFER: None, **given}
    _, plan = entry.prepare({"script": str(script)}, None, str(tmp_path / "r3"), {})
    assert contract.STACKS_AFTER not in plan.env and stacks.RECORDER_BUFFER not in plan.env
    assert hang.after(Limits(1.0, 300.0, 2.0)) == stacks.After(0.5, 299.0, 1.0)  # never less than half a limit


def test_the_dump_times_are_read_strictly():
    assert stacks.After.parse("4.8,298.8,10.8") == stacks.After(4.8, 298.8, 10.8)
    for bad in ("", "1,2", "1,2,x", "1,-2,3", "nan,1,1", "1,2,3,4"):
        assert stacks.After.parse(bad) is None, bad
    env = {contract.RUN_DIR: "/r", contract.ATTEMPT: "2", contract.STACKS_AFTER: "1,2,3"}
    assert stacks.from_env(env) == (Path("/r/stacks/attempt-2"), stacks.After(1, 2, 3))
    assert stacks.from_env({**env, contract.ATTEMPT: "²"}) is None


def test_the_ranks_can_read_the_dump_times_of_the_longest_stall_timeout_the_plan_accepts(tmp_path):
    """--stall-timeout 3e8 was accepted, its derived first-step allowance of 3e9 s was not a dump time the ranks
    read, and every rank silently armed no dump."""
    from sprite.values.grammar import MAX_SECONDS

    script = tmp_path / "t.py"
    script.write_text("")
    for number, given in enumerate(("3e8", f"{MAX_SECONDS:.0f}", "12345678.9")):
        run, plan = entry.prepare({"script": str(script), "stall_timeout": given}, None, str(tmp_path / f"r{number}"),
                                  {})
        assert max(run.limits.stall, run.limits.first_step, run.limits.save) <= MAX_SECONDS
        after = stacks.After.parse(plan.env[contract.STACKS_AFTER])
        assert after == hang.after(run.limits), given
        assert after.stall < run.limits.stall and after.first_step < run.limits.first_step  # each before its limit


def test_collect_waits_3_s_unless_told_otherwise(tmp_path):
    """docs/hangs.md: the watchdog waits at most 3 s for ranks that have not dumped yet."""
    (tmp_path / "rank1.txt").write_text(HEADER + "\n")  # armed, never dumped
    now, slept = [0.0], []

    def sleep(seconds):
        slept.append(seconds)
        now[0] += seconds

    hang.collect(tmp_path, 2, {0: "n1", 1: "n2"}, clock=lambda: now[0], sleep=sleep)
    assert 3.0 <= now[0] < 3.0 + max(slept)


def test_collect_waits_a_bounded_time_and_names_a_rank_that_wrote_nothing(tmp_path):
    (tmp_path / "rank0.txt").write_text(dump(*ALL_REDUCE))
    (tmp_path / "rank1.txt").write_text(HEADER + "\n")  # armed, never dumped
    (tmp_path / "rank0.collectives.json").write_text(json.dumps({"backend": "gloo", "groups": [
        {"pg": "0", "last_enqueued": 3, "last_completed": 2,
         "last": {"op": "all_reduce", "seq": 3, "sizes": [[2]], "completed": False}}]}))
    clock = iter(range(100))
    found = hang.collect(tmp_path, 2, {0: "n1"}, wait=3, clock=lambda: next(clock), sleep=lambda s: None)
    assert next(clock) < 10  # gave up after the wait
    assert found.lines[0] == ("rank 0 on n1: waiting in all_reduce called from training_step (train.py:60); "
                              "collectives: all_reduce #3 (2) not completed (completed up to #2)")
    assert found.lines[1].startswith("rank 1 on n1: wrote no stacks") and found.culprits == ()
    (tmp_path / "rank2.txt").symlink_to(tmp_path / "rank0.txt")
    assert not hang.read_dump(tmp_path, 2).dumped  # never read through a symlink


def test_runs_show_lists_each_stall_and_its_diagnosis():
    records = [{"kind": "launch"}, {"kind": "stall", "attempt": 1, "idle_seconds": 6.1, "allowance": "stall timeout",
                                    "limit_seconds": 6, "ranks": "ranks 0-1 in training step at step 3",
                                    "diagnosis": ["rank 1: stuck", "rank 0: waiting"], "stacks": "stacks/attempt-1"},
               {"kind": "stall", "attempt": 2, "ranks": "rank 0"}]
    assert hang.from_records(records) == [
        "attempt 1 stalled: no rank advanced for 6.1 s (stall timeout 6 s): ranks 0-1 in training step at step 3",
        "  rank 1: stuck", "  rank 0: waiting", "  stacks: stacks/attempt-1/",
        "attempt 2 stalled: no rank advanced for None s (None None s): rank 0",
        "  no diagnosis (a run without stack dumps)"]


# --- inside the rank ---

class FakeHeart:
    def __init__(self):
        self.beat = Beat(1, "n1", os.getpid(), 5, "training step", 10, 0.0, first_step=0)


def test_the_dumper_dumps_when_no_progress_comes_and_forgets_a_dump_once_progress_does(tmp_path):
    from sprite.runtime.hang import dump as rank_dump

    heart = FakeHeart()
    dumper = rank_dump.Dumper(heart, tmp_path, 1, stacks.After(0.3, 60, 60), interval=0.05)
    path = tmp_path / "rank1.txt"
    try:
        dumper.tick(time.monotonic())
        assert dumper.timeout(heart.beat) == 0.3
        time.sleep(1.0)
        text = path.read_text()
        assert oct(path.stat().st_mode & 0o777) == "0o600"
        assert text.startswith(stacks.HEADER) and "(most recent call first):" in text
        assert "test_the_dumper_dumps_when_no_progress_comes" in text  # this thread's own frame
        dumper.tick(time.monotonic())  # no progress: nothing re-arms, one dump however long it lasts
        time.sleep(0.6)
        assert path.read_text().count("Timeout (") == 1
        dumper.tick(time.monotonic() + 1)  # the recorder's summary is due
        assert json.loads((tmp_path / "rank1.collectives.json").read_text())["none"]
        heart.beat = replace(heart.beat, count=11)
        dumper.tick(time.monotonic())
        assert path.read_text().count("\n") == 1 and not (tmp_path / "rank1.collectives.json").exists()
        assert dumper.timeout(replace(heart.beat, first_step=-1)) == 60
    finally:
        faulthandler.cancel_dump_traceback_later()
        os.close(dumper.fd)


def test_progress_between_the_collectives_file_and_the_dump_removes_the_collectives_file(tmp_path):
    """The collectives file is written one interval before the dump; progress in between prevents the dump, and the
    collectives file of that slow step must go too, or a later stall shows it beside stacks of another moment."""
    from sprite.runtime.hang import dump as rank_dump

    heart = FakeHeart()
    dumper = rank_dump.Dumper(heart, tmp_path, 1, stacks.After(60, 60, 60), interval=0.05)
    collectives = tmp_path / "rank1.collectives.json"
    try:
        now = time.monotonic()
        dumper.tick(now)  # armed for 60 s; the summary is due at 59.95 s
        dumper.tick(now + 59.96)
        assert collectives.exists() and (tmp_path / "rank1.txt").read_text().count("\n") == 1  # no dump yet
        heart.beat = replace(heart.beat, count=11)
        dumper.tick(now + 59.99)
        assert not collectives.exists()
        heart.beat = replace(heart.beat, count=12)
        dumper.tick(now + 60.0)  # nothing written since: nothing to remove, and no error
        assert not collectives.exists()
    finally:
        faulthandler.cancel_dump_traceback_later()
        os.close(dumper.fd)


def test_a_rank_in_its_first_step_dumps_by_the_stall_timeout_as_the_watchdog_stops_by_it(tmp_path):
    """The watchdog holds the run to the stall timeout once any rank is past its first step; a rank hung inside its
    own first step (after the first all-reduce, before its on_train_batch_end) dumped only at the first-step
    allowance, after the run was stopped, and so "wrote no stacks"."""
    from sprite.recovery.watchdog import Watch
    from sprite.runtime.hang import dump as rank_dump

    heart = FakeHeart()
    dumper = rank_dump.Dumper(heart, tmp_path, 1, stacks.After(4.8, 298.8, 10.8), interval=0.05)
    os.close(dumper.fd)
    ahead = Beat(0, "n1", 1, 1, "training step", 3, 0.0, first_step=0)  # finished step 0, waits in step 1
    hung = Beat(1, "n1", 2, 0, "training step", 2, 0.0, first_step=0)  # still inside step 0
    watch = Watch(Limits(6, 300, 12), 2, started=0.0)
    watch.observe({0: ahead, 1: hung}, 1.0)
    assert watch.limit_in_force({0: ahead, 1: hung}) == (6, "stall timeout")
    assert dumper.timeout(hung) == 4.8 < 6
    assert dumper.timeout(replace(hung, first_step=-1, phase="start")) == 298.8  # before its first step
    assert dumper.timeout(replace(hung, phase="checkpoint save")) == 10.8


def test_the_dumper_never_writes_over_a_file_or_through_a_symlink(tmp_path, capsys):
    from sprite.runtime.hang import dump as rank_dump

    env = {contract.RUN_DIR: str(tmp_path), contract.ATTEMPT: "1", contract.STACKS_AFTER: "1,2,3"}
    where = stacks.folder(tmp_path, 1)
    where.mkdir(parents=True)
    (where / "rank0.txt").write_text("the user's")
    (where / "rank1.txt").symlink_to(tmp_path / "elsewhere")
    assert rank_dump.start(FakeHeart(), env, 0, 1.0) is None and rank_dump.start(FakeHeart(), env, 1, 1.0) is None
    assert (where / "rank0.txt").read_text() == "the user's" and not (tmp_path / "elsewhere").exists()
    assert "cannot make this rank's stack file" in capsys.readouterr().err
    assert rank_dump.start(FakeHeart(), {**env, contract.STACKS_AFTER: ""}, 2, 1.0) is None


class FakeDist:
    """torch.distributed as the recorder sees it, without torch (a fake: the malformed traces cannot be made)."""

    def __init__(self, backend="gloo"):
        self.backend = backend

    def is_available(self):
        return True

    def is_initialized(self):
        return True

    def get_backend(self):
        if isinstance(self.backend, Exception):
            raise self.backend
        return self.backend


@pytest.mark.parametrize("trace, backend", [
    ({"pg_status": {"0": "x"}}, "gloo"),  # a group's status that is no object
    ([1, 2], "gloo"),  # a trace that is no object
    ({"pg_status": {"0": {}}, "entries": [{"pg_id": "0", "collective_seq_id": "a"}, {"pg_id": "0"}]}, "gloo"),
    ({}, RuntimeError("Invalid process group specified")),  # get_backend raising
], ids=["status-not-object", "trace-not-object", "seq-not-number", "backend-raises"])
def test_the_recorder_summary_never_raises_on_a_trace_or_backend_it_does_not_know(monkeypatch, trace, backend):
    import types

    from sprite.runtime.hang import recorder

    fake = types.ModuleType("fake_c10d")
    fake.dump = lambda *args: json.dumps(trace)
    monkeypatch.setitem(sys.modules, "fake_c10d", fake)
    monkeypatch.setitem(sys.modules, "torch.distributed", FakeDist(backend))
    monkeypatch.setattr(recorder, "RECORDER", ("fake_c10d", "dump"))
    found = recorder.summary()
    assert set(found) == {"backend", "none"}, found
    assert "could not be summarised" in found["none"] or "unknown shape" in found["none"], found


def test_a_clean_up_that_fails_after_progress_leaves_the_dump_armed_and_is_tried_again(tmp_path, monkeypatch):
    """Progress re-arms the dump before it cuts an old dump back: a truncate that fails (ESTALE on NFS) used to skip
    the re-arm for good, since the next look saw no change, and a later stall read the old stacks."""
    from sprite.runtime.hang import dump as rank_dump

    heart = FakeHeart()
    dumper = rank_dump.Dumper(heart, tmp_path, 1, stacks.After(60, 60, 60), interval=0.01)
    armed, cuts = [], []
    monkeypatch.setattr(rank_dump.faulthandler, "dump_traceback_later", lambda *a, **k: armed.append(a[0]))
    real_truncate = rank_dump.os.ftruncate

    def truncate(fd, size):
        cuts.append(size)
        if len(cuts) == 1:
            raise OSError(116, "Stale file handle")
        real_truncate(fd, size)

    monkeypatch.setattr(rank_dump.os, "ftruncate", truncate)
    try:
        os.write(dumper.fd, b"Thread 0x1 (most recent call first):\n  an old dump\n")
        with pytest.raises(OSError):
            dumper.tick(0.0)
        assert armed == [60]  # armed although the clean-up failed
        dumper.tick(0.1)  # the same beat: the clean-up is tried again
        assert len(cuts) == 2 and os.fstat(dumper.fd).st_size == dumper.header
    finally:
        os.close(dumper.fd)


def test_the_stack_thread_outlives_a_failing_tick_and_leaves_no_temporary_file(tmp_path, monkeypatch, capsys):
    """A fault in one look at the heartbeat (a recorder summary that raised, a full disk) is said once; the thread
    goes on re-arming the dump, and a collectives file that could not be written leaves no .tmp behind."""
    from sprite.runtime.hang import dump as rank_dump
    from sprite.runtime.hang import recorder

    dumper = rank_dump.Dumper(FakeHeart(), tmp_path, 1, stacks.After(60, 60, 60), interval=0.01)
    os.close(dumper.fd)
    looks, naps = [], []

    def tick(now):
        looks.append(now)
        if len(looks) <= 2:
            raise ValueError("the recorder's trace changed shape")

    class Enough(BaseException):
        pass

    def sleep(seconds):
        naps.append(seconds)
        if len(naps) == 4:
            raise Enough

    monkeypatch.setattr(dumper, "tick", tick)
    with pytest.raises(Enough):
        dumper._loop(sleep)
    assert len(looks) == 4  # still looking after two failures
    err = capsys.readouterr().err
    assert err.count("sprite: warning:") == 1 and "ValueError: the recorder's trace changed shape" in err

    monkeypatch.setattr(recorder, "summary", lambda: {"backend": "", "none": "x"})
    (tmp_path / "rank1.collectives.json").mkdir()  # the rename onto it fails
    (tmp_path / "rank1.collectives.json" / "x").write_text("")
    with pytest.raises(OSError):
        dumper.write_collectives()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank1.collectives.json", "rank1.txt"]  # no .tmp


RECORDER_PROBE = """
import json, os, tempfile, time, torch, torch.distributed as dist
from sprite.runtime.hang import recorder
print(json.dumps(recorder.summary()))
dist.init_process_group("gloo", rank=0, world_size=1, init_method="file://" + tempfile.mktemp())
dist.all_reduce(torch.ones(3))
dist.barrier()
for _ in range(100):  # the group's last completed number can lag behind wait() (seen under srun, where.pending)
    if recorder.summary()["groups"][0]["last_completed"] == 2:
        break
    time.sleep(0.02)
print(json.dumps(recorder.summary()))
recorder.RECORDER = (recorder.RECORDER[0], "_no_such_dump")
print(json.dumps(recorder.summary()))
real_backend, dist.get_backend = dist.get_backend, lambda *args: "xccl"
print(json.dumps(recorder.summary()))
dist.get_backend = real_backend
dist.destroy_process_group()  # a gloo group alive at exit can abort the interpreter (pytorch#65231, finish.py)
"""


def test_the_flight_recorder_records_gloo_collectives_in_this_torch():
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")}
    env[stacks.RECORDER_BUFFER] = "20"
    done = subprocess.run([sys.executable, "-c", RECORDER_PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    before, after, missing, xccl = (json.loads(line) for line in done.stdout.splitlines()[-4:])
    assert missing == {"backend": "gloo", "none": "the flight recorder could not be read (AttributeError)"}
    assert xccl == {"backend": "xccl", "none": "no flight recorder on XCCL in this torch (torch-xpu-ops issue 5381)"}
    assert before == {"backend": "", "none": "no process group was started"}
    group = after["groups"][0]
    assert after["backend"] == "gloo" and group["last_enqueued"] == group["last_completed"] == 2
    assert group["last"] == {"op": "barrier", "seq": 2, "sizes": [], "dtypes": [], "completed": True}


@pytest.mark.parametrize("name", ["_dump_fr_trace_json"])
def test_the_recorder_dump_is_listed_with_the_private_torch_names(name):
    from sprite.runtime.ckpt import torch_names
    from sprite.runtime.hang import recorder

    assert recorder.RECORDER[1] == name
    assert recorder.RECORDER in [(module, attr) for module, attr, _ in torch_names.PRIVATE]


def test_a_failing_diagnosis_never_keeps_the_watchdog_from_stopping_the_run(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from sprite.recovery import attempt

    def broken(*args, **kwargs):
        raise ValueError("a bug")

    monkeypatch.setattr(hang, "collect", broken)
    watcher = attempt.Watcher(SimpleNamespace(limits=Limits(0.01, 0.01, 0.01)), tmp_path, 2, None, tmp_path)
    time.sleep(0.05)
    stop = watcher().splitlines()
    assert stop[0].startswith("sprite: error: Stopped the run") and watcher.diagnosis is None
    assert stop[1] == f"sprite: stall: no diagnosis (ValueError: a bug); the ranks' stacks are in {tmp_path}/"


def test_runs_show_prints_a_runs_summary_and_its_stalls_and_refuses_a_folder_without_a_trail(tmp_path):
    from sprite.cli import runs
    from sprite.errors import UsageError
    from sprite.integrity import audit

    run = tmp_path / "run"
    run.mkdir()
    audit.append(run / "audit.jsonl", "launch", script="t.py")
    audit.append(run / "audit.jsonl", "stall", attempt=1, idle_seconds=6.2, allowance="stall timeout",
                 limit_seconds=6, ranks="ranks 0-1 in training step at step 3", diagnosis=["rank 1 on n1: stuck"],
                 culprits=[1], stacks="stacks/attempt-1")
    text = runs.show(run)
    assert f"run_dir: {run}" in text and (
        "attempt 1 stalled: no rank advanced for 6.2 s (stall timeout 6 s): ranks 0-1 in training step at step 3\n"
        "  rank 1 on n1: stuck\n  stacks: stacks/attempt-1/") in text
    shown = json.loads(runs.show(run, json_out=True))
    assert [s["culprits"] for s in shown["stalls"]] == [[1]] and shown["run_dir"] == str(run)
    with pytest.raises(UsageError, match="holds no audit trail"):
        runs.show(tmp_path)


def test_the_main_thread_is_the_one_the_header_names_and_a_dump_without_it_is_not_read_yet(tmp_path):
    """A real faulthandler dump of a process whose other thread was started by C code (``_thread``: no threading
    frame at its bottom, as a thread of a C++ library calling Python has none): the main thread is the one the
    rank's header names, not the first without threading's frame; a dump cut before the main thread (faulthandler
    prints it last) is not yet read."""
    script = tmp_path / "probe.py"
    script.write_text(
        "import _thread, faulthandler, json, sys, threading, time\n"
        "from sprite.contract import stacks\n"
        "from sprite.runtime.hang.dump import _facts\n"
        "def hook_in_c_thread():\n"
        "    time.sleep(30)\n"
        "def training_step():\n"
        "    _thread.start_new_thread(hook_in_c_thread, ())\n"
        "    time.sleep(0.5)\n"
        "    sys.stdout.write(stacks.HEADER + json.dumps(_facts(1)) + '\\n')\n"
        "    sys.stdout.flush()\n"
        "    faulthandler.dump_traceback(sys.stdout, all_threads=True)\n"
        "training_step()\n")
    text = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60).stdout
    dump = parse(text)
    assert dump.dumped and [t.frames[0].func for t in dump.threads][0] == "hook_in_c_thread"  # printed first
    assert dump.main().frames[-2].func == "training_step" or dump.main().frames[0].func == "training_step"
    assert "hook_in_c_thread" not in places.of(dump).text and "training_step" in places.of(dump).text
    cut = text[:text.rindex("Current thread") if "Current thread" in text else text.rindex("Thread 0x")]
    assert not parse(cut).dumped  # the helper thread alone: read again until the main thread is there
