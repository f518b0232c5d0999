"""Ranks forked from the warm local supervisor (sprite.launch.warmstart) against fresh interpreters: real 2-rank
gloo fits of tests/scripts/warm_probe.py, one launch each way, and which launches may fork at all."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sprite import contract
from sprite.launch import devicecount, warmstart

from conftest import LEAK_GUARDED, OUTSIDE_CHECKOUT, SCHEDULER_VARS, WARM_SERVER, start_warm_server, stop_warm_server

FRESH_RANKS = True  # fresh interpreters against forks of the supervisor: no warm server (conftest.py)

SCRIPT = str(Path(__file__).resolve().parent / "scripts" / "warm_probe.py")


def _launch(sprite_cmd, root: Path, tag: str, fork: bool, *extra: str, server: Path | None = None) -> dict:
    out = root / tag
    out.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in (*LEAK_GUARDED, *SCHEDULER_VARS)}
    env[warmstart.OPT_OUT] = "1" if fork else "0"
    if server:
        env[WARM_SERVER] = str(server)
    done = subprocess.run([*sprite_cmd, "run", "--devices", "2", "--accelerator", "cpu", "--run-dir",
                           str(out / "run"), SCRIPT, str(out), *extra], env=env, cwd=OUTSIDE_CHECKOUT,
                          capture_output=True, text=True, timeout=300)
    records = {rank: json.loads((out / f"rank{rank}.json").read_text()) for rank in (0, 1)
               if (out / f"rank{rank}.json").exists()}
    return {"code": done.returncode, "stderr": done.stderr, "stdout": done.stdout, "records": records, "out": out}


@pytest.fixture(scope="module")
def fits(sprite_cmd, tmp_path_factory):
    root = tmp_path_factory.mktemp("warm")
    server, sock = start_warm_server(tmp_path_factory.mktemp("server"))
    found = {"fork": _launch(sprite_cmd, root, "fork", True), "fresh": _launch(sprite_cmd, root, "fresh", False),
             "fail": _launch(sprite_cmd, root, "fail", True, "--fail-rank", "1")}
    deadline = time.monotonic() + 180
    while not sock.exists() and time.monotonic() < deadline and server.poll() is None:
        time.sleep(0.2)
    found["served"] = _launch(sprite_cmd, root, "served", True, server=sock)
    stop_warm_server(server)
    return found


@pytest.mark.slow
def test_forked_ranks_train_and_end_as_fresh_interpreters_do(fits):
    fork, fresh = fits["fork"], fits["fresh"]
    assert fork["code"] == 0 and fresh["code"] == 0, fork["stderr"][-3000:] + fresh["stderr"][-3000:]
    for rank in (0, 1):
        forked, started = fork["records"][rank], fresh["records"][rank]
        assert "sprite.launch.supervisor" in forked["cmdline"]  # a fork of the supervisor: its command line
        assert "sprite.runtime" in started["cmdline"] and "sprite.launch.supervisor" not in started["cmdline"]
        assert forked["losses"] == started["losses"] and len(forked["losses"]) == 4  # bit for bit
        assert forked["rank_zero_only"] == started["rank_zero_only"] == rank  # Lightning's filter, per rank
        assert forked["argv"] == [str(fork["out"])] and started["argv"] == [str(fresh["out"])]
        assert forked["main"] == started["main"] == SCRIPT
        assert forked["handlers"] == started["handlers"]  # not the supervisor's: a new interpreter's, sprite's own
        assert forked["threads"] == started["threads"]  # OMP_NUM_THREADS was set before torch was imported
        for tag in ("fork", "fresh"):
            assert (fits[tag]["out"] / f"atexit{rank}").exists(), tag  # the interpreter ended normally
        # gc.freeze() in the supervisor keeps the imported pages shared after the rank's own full collection:
        # measured here, a forked rank's private memory 34 MB (120 MB without the freeze), a fresh rank's 288 MB
        assert forked["memory_kb"]["private"] <= 0.25 * started["memory_kb"]["private"], (forked, started)
    served = fits["served"]  # the ranks forked by a warm server (sprite.launch.warmserver)
    assert served["code"] == 0, served["stderr"][-3000:]
    for rank in (0, 1):
        got, started = served["records"][rank], fresh["records"][rank]
        assert "sprite.launch.warmserver" in got["cmdline"]
        for key in ("losses", "main", "handlers", "threads"):
            assert got[key] == started[key], key
        assert (got["rank_zero_only"], got["argv"]) == (rank, [str(served["out"])])
        assert (served["out"] / f"atexit{rank}").exists()
        assert got["memory_kb"]["private"] <= 0.25 * started["memory_kb"]["private"], (got, started)
    for found in (fork, fresh, served):  # numpy's global generator: seeded apart in every rank
        assert found["records"][0]["numpy_draw"] != found["records"][1]["numpy_draw"]
        said = found["stdout"] + found["stderr"]
        assert "[rank 0] GPU available" in said and "[rank 1] GPU available" not in said


@pytest.mark.slow
def test_a_forked_rank_that_fails_stops_the_run_with_its_code(fits):
    fail = fits["fail"]
    assert fail["code"] != 0 and set(fail["records"]) == {0, 1}, fail["stderr"][-3000:]
    assert "rank 1 exited with code 3" in fail["stderr"], fail["stderr"][-3000:]


def test_only_cpu_ranks_of_this_interpreters_runtime_are_forked(monkeypatch):
    cmd = [sys.executable, "-m", "sprite.runtime", "train.py"]
    cpu = {contract.ACCELERATOR: "cpu"}
    assert warmstart.wanted(cmd, cpu)
    for accelerator in ("cuda", "xpu", "gpu", "mps"):  # a device runtime must not start before a fork
        assert not warmstart.wanted(cmd, {contract.ACCELERATOR: accelerator})
    assert not warmstart.wanted(cmd, {**cpu, warmstart.OPT_OUT: "0"})
    assert not warmstart.wanted(["/staged/copy/bin/python", *cmd[1:]], cpu)  # another interpreter (--stage)
    assert not warmstart.wanted([sys.executable, "train.py"], cpu)  # not sprite's runtime
    monkeypatch.setattr(devicecount, "intel_cards", lambda sysfs="/sys": [])
    monkeypatch.setattr(devicecount, "nvidia_gpus", lambda environ: 1)
    assert not warmstart.wanted(cmd, {contract.ACCELERATOR: "auto"})  # auto with a GPU here: fresh ranks
    monkeypatch.setattr(devicecount, "nvidia_gpus", lambda environ: 0)
    assert warmstart.wanted(cmd, {contract.ACCELERATOR: "auto"})
