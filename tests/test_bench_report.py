"""`sprite bench`'s arithmetic and files, from records written by hand: reduction over ranks and windows,
tokens/s, MFU, communication, efficiency, the launch-bound verdict, write-once files, and the plot's absence."""

from __future__ import annotations

import os
import stat

import pytest

from sprite.parity.bench import plot as bench_plot
from sprite.parity.bench import stats as bench_stats
from sprite.parity.bench import store as bench_store
from sprite.parity.bench import summary as bench_summary
from sprite.parity.bench.settings import BenchSettings
from sprite.errors import UsageError
from sprite.integrity.writeonce import IntegrityError

SETTINGS = BenchSettings(batch=4, seq=8, steps=4, window=2, warmup=1, baselines=("raw",))


def window(mode, seconds, batch=4, loader=0.01):
    return {"mode": mode, "batch": batch, "steps": 2, "seconds": seconds, "loader_seconds": loader}


def record(rank, seconds, flops=6_000_000, measured=None):
    modes = ("sync", "nosync", "sync", "nosync", "probe")
    return {"rank": rank, "device": "cpu", "device_name": "cpu (x86_64)", "flops_per_step": flops,
            "windows": [window(m, s, 8 if m == "probe" else 4) for m, s in zip(modes, seconds)],
            "memory": None, "measured_peak": measured,
            "table_peak": {"tflops": None, "source": "no peak for 'cpu (x86_64)' in sprite's table"}}


def two_ranks(measured=None):
    return [record(0, (0.2, 0.10, 0.4, 0.12, 0.25), measured=measured),
            record(1, (0.3, 0.14, 0.2, 0.10, 0.30), measured=measured)]


def test_step_time_is_the_slowest_rank_per_window_then_the_median():
    figures = bench_stats.arm_figures([two_ranks()], SETTINGS, world=2, repeats=[0])
    # Synced windows per step: max(0.10, 0.15) and max(0.20, 0.10); median of the two.
    assert figures["step_s"] == {"median": pytest.approx(0.175), "min": 0.15, "max": 0.2, "n": 2}
    assert figures["nosync_step_s"]["median"] == pytest.approx(0.065)  # max(.05,.07), max(.06,.05)
    assert figures["comm_s"] == pytest.approx(0.175 - 0.065)
    assert figures["ranks"]["medians"] == [pytest.approx(0.15), pytest.approx(0.125)]
    assert figures["tokens_per_step"] == 4 * 8 * 2
    assert figures["tokens_per_s"] == pytest.approx(figures["tokens_per_step"] / figures["step_s"]["median"])
    assert figures["tokens_per_s_per_device"] == pytest.approx(figures["tokens_per_s"] / 2)
    assert figures["data_share"] == pytest.approx((0.02 / 0.6 + 0.02 / 0.5) / 2)  # loader s / step s, median of ranks
    assert figures["probe"] == {"batch": 8, "step_s": 0.15, "ratio": pytest.approx(0.15 / 0.175), "launch_bound": True}
    assert figures["mfu"] is None and "no peak" in figures["peak"]["source"]


def test_mfu_is_achieved_flops_over_the_peak():
    measured = {"tflops": 1e-4, "source": "measured: 10 512x512 float32 GEMMs"}
    figures = bench_stats.arm_figures([two_ranks(measured)], SETTINGS, world=2, repeats=[0])
    assert figures["flops_per_step"] == 12_000_000
    assert figures["tflops_per_device"] == pytest.approx(6e6 / 0.175 / 1e12)
    assert figures["mfu"] == pytest.approx(figures["tflops_per_device"] / 1e-4)


def test_efficiency_and_ratios():
    one = bench_stats.arm_figures([[record(0, (0.2, 0.1, 0.2, 0.1, 0.5))]], SETTINGS, world=1, repeats=[0])
    two = bench_stats.arm_figures([two_ranks()], SETTINGS, world=2, repeats=[0])
    points = [{"world": 1, "arms": {"sprite": one}}, {"world": 2, "arms": {"sprite": two}}]
    efficiency = bench_stats.efficiency(points)
    assert efficiency[1] == 1.0 and efficiency[2] == pytest.approx(0.1 / 0.175)
    # The same figure as tokens/s against ideal linear scaling from world 1.
    assert efficiency[2] == pytest.approx(two["tokens_per_s"] / (2 * one["tokens_per_s"]))
    assert one["probe"]["launch_bound"] is False  # 0.25 s a step at twice the batch: x2.5
    base = {**one, "repeats": [0, 1], "per_launch_step_s": [0.2, 0.1]}
    sprite = {**one, "repeats": [1, 0], "per_launch_step_s": [0.11, 0.3]}
    assert bench_stats.ratio(sprite, base) == {"median": 1.0, "min": pytest.approx(1.1), "max": pytest.approx(1.5),
                                               "pairs": 2}


def test_summary_puts_the_verdict_first_and_states_the_ratio_against_raw():
    one = bench_stats.arm_figures([[record(0, (0.2, 0.1, 0.2, 0.1, 0.21))]], SETTINGS, world=1, repeats=[0])
    raw = bench_stats.arm_figures([[record(0, (0.1, 0.1, 0.1, 0.1, 0.1))]], SETTINGS, world=1, repeats=[0])
    point = {"world": 1, "arms": {"sprite": one, "raw": raw}, "ratios": {"raw": bench_stats.ratio(one, raw)},
             "efficiency": 1.0}
    report = {"launches": [{}, {}], "failures": [], "points": [point]}
    lines = bench_summary.lines(report, SETTINGS)
    assert lines[0] == "verdict: all of 2 launches measured"
    assert "sprite 100.0 ms a step, 2.000x the raw PyTorch loop (50.0 ms)" in lines[1]
    assert any(line.startswith("MFU not reported: no peak for 'cpu (x86_64)'") for line in lines)
    assert any(line.startswith("launch-bound at world 1: doubling the batch to 8") for line in lines)
    report["failures"] = [{"what": "world 2 raw repeat 1 exited 1", "log": "logs/w2-raw-r0.log"}]
    lines = bench_summary.lines(report, SETTINGS)
    assert lines[0] == "verdict: 1 of 2 launches measured; 1 FAILED (see the logs below)"
    assert lines[-1] == "FAILED: world 2 raw repeat 1 exited 1 (log: logs/w2-raw-r0.log)"


def test_results_are_written_once_with_mode_0600(tmp_path):
    old = os.umask(0)
    try:
        bench_store.write_json(tmp_path / "a.json", {"x": float("nan")})
        folder = bench_store.make_dir(tmp_path / "runs" / "w2" / "sprite-r0")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "a.json").stat().st_mode) == 0o600
    assert {stat.S_IMODE(p.stat().st_mode) for p in (folder, folder.parent, folder.parent.parent)} == {0o700}
    with pytest.raises(IntegrityError, match="refusing to write a file over it"):
        bench_store.write_json(tmp_path / "a.json", {})
    (tmp_path / "link").symlink_to(tmp_path / "target")
    with pytest.raises(IntegrityError):
        bench_store.write_json(tmp_path / "link", {})
    assert not (tmp_path / "target").exists() and (tmp_path / "a.json").read_text() == '{\n "x": null\n}'
    with pytest.raises(UsageError, match="is already used; refusing to run into it"):
        bench_store.claim(tmp_path, BenchSettings())


def test_plot_is_skipped_with_a_reason_without_matplotlib(tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else real(name, *a))
    assert bench_plot.write(tmp_path, {"points": []}) == {
        "skipped": "matplotlib is not installed (pip install 'sprite-hpc[plot]')"}
    assert not (tmp_path / bench_plot.PLOT_FILE).exists()
    monkeypatch.setattr(bench_plot, "_pyplot", lambda: pytest.fail("imported matplotlib"))
    bench_plot.prepare()  # nothing to prepare
