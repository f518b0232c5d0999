"""The checkpoint check's pure parts: its launch table, scheduling, comparison rules, option checks and the two
re-keyings of optimizer state (consolidation, FSDP2 resume of a 1-device checkpoint). No launches."""

from __future__ import annotations

import subprocess
import sys

import pytest
from typer.testing import CliRunner

from conftest import OUTSIDE_CHECKOUT
from sprite.errors import UsageError
from sprite.parity.ckpt.cli import app
from sprite.parity.ckpt.criterion import difference, restore_checks
from sprite.parity.ckpt.roles import Launch, expected_results, launches
from sprite.parity.ckpt.runner import _next
from sprite.parity.ckpt.settings import CkptSettings


def test_the_launch_table_respects_its_order_and_shares_the_fsdp2_training():
    table = launches(CkptSettings(devices=4))
    keys = [launch.key for launch in table]
    assert len(keys) == len(set(keys)) == 19
    for index, launch in enumerate(table):
        assert all(dep in keys[:index] for dep in launch.after), launch
    assert not any(key.startswith("fsdp_file-") and key.split("-")[1] in ("fit", "twin", "killed") for key in keys)
    reshard = next(launch for launch in table if launch.role == "reshard")
    assert (reshard.devices, reshard.nodes, reshard.after) == (2, 1, ("fsdp-killed",))
    export = next(launch for launch in table if launch.role == "export")
    assert export.processes == 1 and set(export.after) == {"ddp-killed", "fsdp-killed"}
    assert CkptSettings(devices=4, nodes=2).half_world() == (4, 1)
    assert len(expected_results(CkptSettings())) == 18 + 12 + 3


def _launch(key: str, processes: int) -> Launch:
    return Launch(key, "x", "fit", "ddp", processes, 1)


def test_two_one_process_launches_share_the_slots_and_a_distributed_one_takes_both():
    one, two, wide = _launch("a", 1), _launch("b", 1), _launch("w", 2)
    assert _next([one, two, wide], 2) == [one, two]
    assert _next([one, wide], 2) == [wide]
    assert _next([one, wide], 1) == [one]
    assert _next([wide], 1) == []


def test_more_slots_start_independent_launches_side_by_side():
    one, two, three, wide, wider = (_launch("a", 1), _launch("b", 1), _launch("c", 1), _launch("w", 2),
                                    _launch("v", 4))
    assert _next([one, two, wide, wider], 6) == [one, wide, wider, two]  # a distributed launch takes two slots
    assert _next([one, wide, wider], 3) == [wide, one]
    assert _next([one, two, three, wide], 4) == [one, two, wide]  # ... when two one-process ones don't wait
    assert _next([one, two, three, wide], 3) == [one, two, three]


SAVED = {"trainables": {"a": "1", "b": "2"}, "optimizer": {"a/exp_avg": "3"}, "optimizer_devices": ["cuda:1"],
         "param_groups": [{"lr": 0.1}], "scheduler": {"last_epoch": 3}, "frozen": {"f": "4"},
         "loop": {"global_step": 3, "next_epoch": 1}}


def test_a_restore_differs_only_where_the_state_differs():
    assert all(difference(family, SAVED, dict(SAVED), full=False) == "" for family in SAVED)
    changed = {**SAVED, "trainables": {"a": "1", "b": "9"}, "optimizer": {}}
    assert "1 of 2 differ (first: b)" == difference("trainables", SAVED, changed, full=False)
    assert "differ" in difference("optimizer", SAVED, changed, full=False)
    moved = {**SAVED, "optimizer_devices": ["cuda:0"]}
    assert difference("optimizer", SAVED, moved, full=False) and not difference(
        "optimizer", {**SAVED, "optimizer_full": SAVED["optimizer"]}, {**moved, "optimizer_full": SAVED["optimizer"]},
        full=True)
    saved = {**SAVED, "frozen_full": {"f": "4", "g": "5"}}
    record = {"restored": changed, "frozen_before_load": {"f": "40", "g": "50"}}
    checks = restore_checks("x", [saved], {"ranks": [record]}, full=False)
    assert [c["family"] for c in checks if not c["passed"]] == ["trainables", "optimizer"]
    record["frozen_before_load"]["g"] = "5"  # one frozen tensor was not changed before the load
    failed = [c for c in restore_checks("x", [saved], {"ranks": [record]}, full=False) if not c["passed"]]
    assert failed[-1]["name"] == "x every frozen tensor changed before the load" and failed[-1]["value"] == "1 of 2"


@pytest.mark.parametrize("args, words", [
    (["--devices", "3"], "even number"),
    (["--devices", "1"], "at least 2 ranks"),
    (["--precision", "fp8"], "--precision"),
    (["--model", "Qwen/Qwen2.5-0.5B"], "hub"),
    (["--time-limit", "0"], "--time-limit"),
    (["--slots", "1"], "--slots"),
    (["--devices", "99999999999999999999"], "--devices 99999999999999999999 is more than 1,024"),  # "even number"
    (["--slots", "99999999999999999999"], "--slots 99999999999999999999 is more than 4,096"),  # it ran the check
])
def test_bad_usage_exits_2_before_anything_is_written(args, words, tmp_path):
    result = CliRunner().invoke(app, ["--out", str(tmp_path / "never"), *args])
    assert result.exit_code == 2 and words in result.output
    assert not (tmp_path / "never").exists()


def test_the_command_modules_import_nothing_heavy():
    probe = ("import sys, sprite.parity.ckpt.cli, sprite.cli.ckpt, sprite.runtime.ckpt.consolidate; "
             "print(sorted({'torch', 'lightning', 'transformers'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                         cwd=OUTSIDE_CHECKOUT).stdout
    assert out.strip() == "[]"


def test_consolidation_keys_optimizer_state_by_position_in_param_group_order():
    from sprite.runtime.ckpt.consolidate import _by_position

    state = {"state": {"b": {"step": 1}, "a": {"step": 2}},
             "param_groups": [{"lr": 1, "params": ["b", "c"]}, {"lr": 2, "params": ["a"]}]}
    assert _by_position(state) == {"state": {0: {"step": 1}, 2: {"step": 2}},
                                   "param_groups": [{"lr": 1, "params": [0, 1]}, {"lr": 2, "params": [2]}]}
    with pytest.raises(UsageError, match="no param group lists"):
        _by_position({"state": {"z": {}}, "param_groups": [{"params": ["a"]}]})


def test_fsdp2_maps_saved_positions_through_the_optimizers_own_parameters():
    import torch

    from sprite.runtime.ckpt.fsdp2_load import by_name, positional

    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2))
    model[0].requires_grad_(False)  # frozen first, as a LoRA backbone is: Lightning maps position 0 to it
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
    saved = {"state": {0: {"step": 1}, 1: {"step": 2}}, "param_groups": [{"lr": 1, "params": [0, 1]}]}
    assert positional({"optimizer_states": [saved]})
    assert by_name(saved, optimizer, model) == {"state": {"1.weight": {"step": 1}, "1.bias": {"step": 2}},
                                                "param_groups": [{"lr": 1, "params": ["1.weight", "1.bias"]}]}
    with pytest.raises(UsageError, match="holds 1 parameters, this one 2"):
        by_name({"state": {}, "param_groups": [{"params": [0]}]}, optimizer, model)


def test_the_progress_display_shows_each_launch_its_state_and_the_time_left():
    import io

    from rich.console import Console

    from sprite.parity.ckpt.runner import board

    table = launches(CkptSettings())
    sink = io.StringIO()
    with board(table, Console(file=sink, force_terminal=True, width=120), 60) as display:
        display.start("single-fit")
        display.finish("single-fit", True)
        display.start("ddp-fit")
        display.finish("ddp-fit", False, "not executed: timed out after 60 s")
        display.skip("ddp-resume", "a launch it needs failed")
        display.console.print(display)
    text = sink.getvalue()
    assert "single-fit" in text and "done" in text and "timed out after 60 s" in text and "waiting" in text
    assert "skipped (a launch it needs failed)" in text and "2 processes" in text
    assert "ckpt-check launches (time limit 60 s each)" in text and " left" in text
    assert 0 < display.estimate_left() < float("inf")
    log = io.StringIO()  # not a terminal (a batch job's log): one line per start and end, the estimate included
    with board(table, Console(file=log, force_terminal=False, width=120), 60) as display:
        display.start("single-fit")
        display.finish("single-fit", True)
        display.skip("ddp-resume", "the check ended before it started")
    lines = log.getvalue().splitlines()
    assert lines[0].endswith("single-fit: 1 process ...")
    assert " single-fit: done in " in lines[1] and lines[1].endswith(" left") and len(lines) == 3
    assert lines[2].endswith("ddp-resume: skipped, the check ended before it started")


def test_compare_never_writes_over_an_existing_report(tmp_path):
    existing = tmp_path / "report.json"
    existing.write_text("mine")
    result = CliRunner().invoke(app, ["compare", str(tmp_path), "--report", str(existing)])
    assert result.exit_code == 2 and "exists already" in result.output and existing.read_text() == "mine"


def _step(index: int) -> dict:
    return {"global_step": index, "epoch": index, "batch_idx": 0, "rows": [index], "loss": 0.5, "lr": [0.1 / (1 + index)]}


def test_a_fault_is_rejected_only_for_the_checks_attributable_to_it():
    from sprite.parity.ckpt.judge import fault_case
    from sprite.parity.ckpt.roles import checkpoint

    settings = CkptSettings(devices=2, epochs=2, steps_per_epoch=1)
    saved = {**SAVED, "frozen_full": {"f": "4"}}
    fit = {"ranks": [{"steps": [_step(0), _step(1)]}]}
    killed = {"ranks": [{"steps": [_step(0), _step(1)], "saves": {checkpoint("single", "killed", 1): {"state": saved}}}]}

    def case(restored: dict) -> dict:
        result = {"ranks": [{"restored": restored, "steps": [_step(1)], "frozen_before_load": {"f": "9"}}]}
        get = {"single/fit": fit, "single/killed": killed, "single/fault_dropped-optimizer-state": result}.get
        return fault_case("single", "dropped-optimizer-state", get, {}, True, settings)

    dropped = case({**saved, "optimizer": {}})
    assert dropped["status"] == "rejected" and dropped["evidence"] == ["optimizer"]
    also_weights = case({**saved, "optimizer": {}, "trainables": {"a": "0", "b": "2"}})
    assert also_weights["status"] == "not rejected" and "trainables" in also_weights["reason"]
    assert case(dict(saved))["status"] == "not rejected"  # nothing failed: the fault went unseen
    missing = fault_case("single", "dropped-optimizer-state", {}.get, {"single/fault_dropped-optimizer-state": "gone"},
                         True, settings)
    assert missing["status"] == "not executed" and missing["reason"] == "gone"
    # docs/ckpt-check.md: a fault is rejected only when the clean arm passed; without that reference it is not executed
    dropped_rank = {"restored": {**saved, "optimizer": {}}, "steps": [_step(1)], "frozen_before_load": {"f": "9"}}
    result = {"ranks": [dropped_rank]}
    get = {"single/fit": fit, "single/killed": killed, "single/fault_dropped-optimizer-state": result}.get
    unjudged = fault_case("single", "dropped-optimizer-state", get, {}, False, settings)
    assert unjudged["status"] == "not executed" and "clean arm failed" in unjudged["reason"]


def test_compare_refuses_another_checks_folder_and_reads_an_edited_launch_record_without_a_traceback(tmp_path):
    """A folder whose run.json is unsealed is not a ckpt-check folder: exit 2, not "changed after the run";
    a launch record edited into a list or stripped of its limit names itself instead of raising."""
    from sprite.errors import UsageError
    from sprite.parity.ckpt import compare as ckpt_compare

    (tmp_path / "run.json").write_text('{"precision": "32-true"}')
    with pytest.raises(UsageError, match="has no manifest, so .* cannot be compared as a `sprite ckpt-check` run"):
        ckpt_compare.load_settings(tmp_path)
    (tmp_path / "launches").mkdir()
    for body in ("[1]", '{"timed_out": true}', "garbage"):
        (tmp_path / "launches" / "ddp-fit.json").write_text(body)
        said = ckpt_compare.launch_outcome(tmp_path, "ddp-fit")
        assert said.startswith("not executed: launch ddp-fit's record ddp-fit.json cannot be read"), said
