"""sprite's local supervisor with real processes: labels output, stops everything when one rank fails."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

RANK_SCRIPT = """
import os, signal, sys, time
out = sys.argv[1]
rank = os.environ["RANK"]
open(os.path.join(out, f"pid{rank}"), "w").write(str(os.getpid()))
def on_term(signum, frame):
    open(os.path.join(out, f"term{rank}"), "w").write("1")
    sys.exit(143)
signal.signal(signal.SIGTERM, on_term)
for sig in (signal.SIGUSR1, signal.SIGUSR2):
    signal.signal(sig, lambda signum, frame: open(os.path.join(out, f"sig{signum}-{rank}"), "w").close())
print(f"hello from {rank} of {os.environ['WORLD_SIZE']} local {os.environ['LOCAL_RANK']}", flush=True)
print(f"threads {os.environ['OMP_NUM_THREADS']}", flush=True)
open(os.path.join(out, f"ready{rank}"), "w").close()
if rank == os.environ.get("FAIL_RANK"):
    # fail only once every rank has its SIGTERM handler: on busy cores rank 0 could still be starting, die of the
    # signal's default action and leave no term0 (seen once in CI)
    ready = [os.path.join(out, f"ready{r}") for r in range(int(os.environ["WORLD_SIZE"]))]
    deadline = time.monotonic() + 30
    while not all(map(os.path.exists, ready)) and time.monotonic() < deadline:
        time.sleep(0.02)
    sys.exit(3)
time.sleep(float(os.environ.get("SLEEP", "0")))
"""


def start(tmp_path: Path, nproc: int, **env) -> subprocess.Popen:
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    full_env = {**os.environ, "WORLD_SIZE": str(nproc), **env}
    cmd = [sys.executable, "-m", "sprite.launch.supervisor", "--nproc", str(nproc), "--log-dir", str(tmp_path / "logs"),
           "--", sys.executable, str(script), str(tmp_path)]
    return subprocess.Popen(cmd, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_pids(tmp_path: Path, nproc: int, timeout: float = 20) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        files = [tmp_path / f"pid{r}" for r in range(nproc)]
        if all(f.exists() and f.read_text() for f in files):
            return [int(f.read_text()) for f in files]
        time.sleep(0.05)
    raise AssertionError("ranks did not start")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie is dead for our purposes
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split()[2] != "Z"


def test_all_ranks_succeed_and_output_is_labelled(tmp_path, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    proc = start(tmp_path, 3)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0
    assert f"[rank 2] threads {max(1, (os.cpu_count() or 1) // 3)}" in out.splitlines()
    for rank in range(3):
        assert f"[rank {rank}] hello from {rank} of 3 local {rank}" in out.splitlines()
        assert f"hello from {rank}" in (tmp_path / "logs" / f"rank{rank}.log").read_text()


def test_failed_rank_stops_the_others_and_sets_exit_code(tmp_path):
    started = time.monotonic()
    proc = start(tmp_path, 2, FAIL_RANK="1", SLEEP="120")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 3
    assert time.monotonic() - started < 30
    assert "rank 1 exited with code 3" in err
    assert (tmp_path / "term0").exists()  # rank 0 got SIGTERM and could clean up
    assert not alive(int((tmp_path / "pid0").read_text()))


def test_killed_rank_ends_the_run_without_leftovers(tmp_path):
    proc = start(tmp_path, 2, SLEEP="120")
    pids = wait_for_pids(tmp_path, 2)
    os.kill(pids[1], signal.SIGKILL)
    proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGKILL
    assert not any(alive(pid) for pid in pids)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_signals_are_forwarded(tmp_path, sig):
    proc = start(tmp_path, 2, SLEEP="120")
    pids = wait_for_pids(tmp_path, 2)
    proc.send_signal(sig)
    proc.communicate(timeout=30)
    assert proc.returncode == 128 + sig
    assert not any(alive(pid) for pid in pids)
    if sig == signal.SIGTERM:
        assert (tmp_path / "term0").exists() and (tmp_path / "term1").exists()


def test_usr1_and_usr2_reach_every_rank_which_keeps_running(tmp_path):
    proc = start(tmp_path, 2, SLEEP="3")
    wait_for_pids(tmp_path, 2)
    for sig in (signal.SIGUSR1, signal.SIGUSR2):
        proc.send_signal(sig)
        time.sleep(0.3)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err  # the ranks finished their sleep: the signals did not stop them
    assert sorted(p.name for p in tmp_path.glob("sig*")) == sorted(
        f"sig{int(sig)}-{rank}" for sig in (signal.SIGUSR1, signal.SIGUSR2) for rank in (0, 1))


def test_console_filter_keeps_every_rank_in_its_log(tmp_path):
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    cmd = [sys.executable, "-m", "sprite.launch.supervisor", "--nproc", "3", "--ranks", "1", "--log-dir",
           str(tmp_path / "logs"), "--", sys.executable, str(script), str(tmp_path)]
    done = subprocess.run(cmd, env={**os.environ, "WORLD_SIZE": "3"}, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert [line for line in done.stdout.splitlines() if "hello" in line] == ["[rank 1] hello from 1 of 3 local 1"]
    for rank in range(3):
        assert f"hello from {rank}" in (tmp_path / "logs" / f"rank{rank}.log").read_text()
    again = subprocess.run(cmd, env={**os.environ, "WORLD_SIZE": "3"}, capture_output=True, text=True, timeout=60)
    assert again.returncode == 2 and "already holds rank logs" in again.stderr


def test_the_supervisor_adds_the_rank_variables_docs_run_md_names_and_no_other(monkeypatch):
    """docs/run.md (--dry-run --json): the plan's env holds what the plan sets; the local supervisor adds these."""
    from sprite.launch import supervisor

    named = {"RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK", "OMP_NUM_THREADS",
             "PYTHONUNBUFFERED"}
    for name in named:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WORLD_SIZE", "2")  # the plan's
    env = supervisor.rank_env(1, 2)
    assert {key for key in env if os.environ.get(key) != env[key]} == named
    assert (env["RANK"], env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"]) == ("1", "1", "2")
