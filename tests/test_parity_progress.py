"""The progress display of long checks (parity/progress.py), the verdict-first report, and the per-step gap PNG.

The board runs on a fake clock (a list the test advances), so its estimates are exact numbers."""

from __future__ import annotations

import io

from rich.console import Console

from sprite.parity.check import plot
from sprite.parity.check import report
from sprite.parity.progress import ProgressBoard

ITEMS = [("ref", "1 process"), ("ddp", "2 processes"), ("fsdp", "2 processes")]


def board_at(now: list, terminal: bool):
    console = Console(file=io.StringIO(), force_terminal=terminal, width=100, color_system=None)
    return console, ProgressBoard(console, ITEMS, "parity arms", clock=lambda: now[0])


def test_estimate_uses_finished_items_of_the_same_kind():
    now = [0.0]
    _, board = board_at(now, terminal=False)
    assert board.estimate_left() is None
    board.start("ref")
    now[0] = 10.0
    board.finish("ref", ok=True)
    assert board.estimate_left() == 20.0  # no 2-process arm finished yet: the overall mean, twice
    board.start("ddp")
    now[0] = 15.0
    assert board.estimate_left() == 15.0  # ddp has 5 of its expected 10 s left, fsdp 10
    now[0] = 40.0
    board.finish("ddp", ok=True)
    assert board.estimate_left() == 30.0  # fsdp is expected to take as long as ddp did
    board.console.print(board)
    rows = [line for line in board.console.file.getvalue().splitlines() if "│" in line]
    assert "10 s" in rows[0] and "30 s" in rows[1]  # ref started at clock 0 still shows its time


def test_lines_for_logs_and_a_live_table_for_terminals():
    now = [0.0]
    console, board = board_at(now, terminal=False)
    with board:
        board.start("ref")
        now[0] = 12.0
        board.finish("ref", ok=False, note="exit code 1")
    lines = console.file.getvalue().splitlines()
    assert lines == ["[1/3] ref: 1 process ...", "[1/3] ref: failed, exit code 1 in 12.0 s; about 24 s left"]
    console, board = board_at(now, terminal=True)
    board.start("ddp")
    now[0] = 75.0
    console.print(board)
    text = console.file.getvalue()
    assert "ddp" in text and "running" in text and "waiting" in text and "1:03" in text
    assert "0 of 3 finished, 1:03 elapsed, time left: known once one finishes" in text


def fp32_report(gap: float) -> dict:
    checks = [{"name": "ddp devices", "family": "devices", "value": 2, "bound": "> 1", "passed": True},
              {"name": "ddp pre-norm rel", "family": "pre_norm", "value": gap, "bound": 1e-4, "passed": gap <= 1e-4}]
    return {"verdict": "pass" if gap <= 1e-4 else "fail", "checks": checks,
            "per_step": {"ddp vs ref": [0.0, gap, 2 * gap], "fsdp vs ref": [1e-7, 1e-7, 1e-7]}}


def test_verdict_and_summary_first_tables_behind_details():
    console = Console(file=io.StringIO(), width=120, color_system=None)
    report.show({"report.json": fp32_report(0.5)}, "fail", console, details=False)
    text = console.file.getvalue()
    assert text.splitlines()[:3] == ["verdict: fail", "report.json: fail (checks 1/2 passed)",
                                     "  FAIL ddp pre-norm rel: 0.5 (bound 0.0001)"]
    assert "FP32 parity" not in text and "--details" in text
    console = Console(file=io.StringIO(), width=120, color_system=None)
    report.show({"report.json": fp32_report(1e-6)}, "pass", console, details=True)
    assert "FP32 parity (report.json)" in console.file.getvalue()


def test_per_step_gaps_png(tmp_path, monkeypatch):
    reports = {"report.json": fp32_report(1e-6),
               "bf16_report.json": {"diagnostics": {"per_step": {"ddp vs split": [{"max_gap": 0.0}, {"max_gap": 2e-3}]}}}}
    assert plot.series(reports)["ddp vs split"] == [0.0, 2e-3]
    path = plot.write_png(tmp_path, reports)
    assert path == tmp_path / "gaps.png" and path.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert [p.name for p in tmp_path.iterdir()] == ["gaps.png"]  # no temporary file left behind
    monkeypatch.setattr(plot, "available", lambda: False)
    assert plot.write_png(tmp_path / "none", reports) is None
