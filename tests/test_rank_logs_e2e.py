"""Ranks' output under real launchers: one labelled log file per rank under --log-dir, the console filter, and
a hidden rank's failure still reaching the console in one line. (srun's run is in test_submit_slurm.py, which
owns the Slurm fixture.)

MPICH Hydra's mpiexec is the real one from the mpich wheel. PALS exists only on HPE systems, so its run goes
through tests/fakes/pals_mpiexec (a FAKE PALS mpiexec over the real Hydra, named as such).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
HYDRA = Path(sys.executable).parent / "mpiexec"
FAKE_PALS = Path(__file__).parent / "fakes" / "pals_mpiexec"
HELLO = """import os, sys, time
rank = next(os.environ[n] for n in ("PALS_RANKID", "PMI_RANK", "SLURM_PROCID", "RANK") if n in os.environ)
print(f"hello from {rank}")
print(f"note from {rank}", file=sys.stderr)
if rank == "0":
    open("rank0-printed", "w").close()
if rank == os.environ.get("FAIL_RANK"):
    deadline = time.monotonic() + 120  # fail only once rank 0 has printed: the launcher then stops every rank
    while not os.path.exists("rank0-printed") and time.monotonic() < deadline:
        time.sleep(0.1)
    raise RuntimeError(f"boom on rank {rank}")
"""


def sprite_run(sprite_cmd, env, cwd, *args) -> subprocess.CompletedProcess:
    return subprocess.run([*sprite_cmd, "run", *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=240)


@pytest.fixture
def hello(tmp_path) -> Path:
    script = tmp_path / "hello.py"
    script.write_text(HELLO)
    return script


def test_hydra_writes_one_labelled_file_per_rank_and_follows_them(sprite_cmd, clean_env, hello, tmp_path):
    assert HYDRA.exists(), "MPICH Hydra mpiexec is missing: pip install mpich (the test extra)"
    env = {**clean_env, "PYTHONUNBUFFERED": "1"}  # each print as two writes: labels must still start lines
    done = sprite_run(sprite_cmd, env, tmp_path, "--launcher", "mpiexec", "--devices", "2", "--log-dir", "logs",
                      str(hello))
    assert done.returncode == 0, done.stdout + done.stderr
    for rank in (0, 1):
        lines = (tmp_path / "logs" / f"rank{rank}.log").read_text().splitlines()
        # The script never joins a process group: rank 0 says so once (docs/scripts.md), in its own log.
        warned = [line for line in lines if "sprite: warning:" in line]
        assert len(warned) == (1 if rank == 0 else 0) and all("never joined" in line for line in warned), lines
        lines = [line for line in lines if line not in warned]
        assert sorted(lines) == [f"[{rank}] hello from {rank}", f"[{rank}] note from {rank}"], lines
        assert f"[{rank}] hello from {rank}" in done.stdout.splitlines()  # 2 ranks: both followed on the console
    again = sprite_run(sprite_cmd, env, tmp_path, "--launcher", "mpiexec", "--devices", "2", "--log-dir", "logs",
                       str(hello))
    assert again.returncode == 2 and "already holds rank logs" in again.stderr


def test_pals_ranks_tee_their_own_files_and_a_hidden_failure_is_one_line(sprite_cmd, clean_env, hello, tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "mpiexec").symlink_to(FAKE_PALS)
    env = {**clean_env, "PATH": f"{bin_dir}{os.pathsep}{clean_env['PATH']}", "REAL_MPIEXEC": str(HYDRA),
           "FAIL_RANK": "1"}
    done = sprite_run(sprite_cmd, env, tmp_path, "--launcher", "mpiexec", "--mpi", "pals", "--devices", "2",
                      "--ranks", "0", "--log-dir", "logs", str(hello))
    console = done.stdout + done.stderr
    assert done.returncode != 0, console
    assert "[0] hello from 0" in console and "hello from 1" not in console and "Traceback" not in console
    assert "sprite: rank 1 failed: RuntimeError: boom on rank 1 (its output: " in console
    assert "sprite: the console shows rank 0 of 2 ranks" in done.stderr
    # stdout and stderr are teed by two readers: their lines may reach the file in either order
    mine = [line for line in (tmp_path / "logs" / "rank0.log").read_text().splitlines() if "sprite: warning:" not in line]
    assert sorted(mine) == ["hello from 0", "note from 0"]
    hidden = (tmp_path / "logs" / "rank1.log").read_text()
    assert "hello from 1" in hidden and "RuntimeError: boom on rank 1" in hidden and "Traceback" in hidden


def test_follower_forwards_signals_and_passes_the_exit_code(tmp_path):
    marker = tmp_path / "got-term"
    child = (f"trap 'echo TERM > {marker}; exit 7' TERM; echo 'rank 0 up' > {tmp_path}/rank0.log; "
             "while true; do sleep 0.1; done")
    proc = subprocess.Popen([sys.executable, "-m", "sprite.launch.ranklog", "--dir", str(tmp_path), "--ranks", "0",
                             "--size", "1", "--", "bash", "-c", child], stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not (tmp_path / "rank0.log").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.5)  # the trap is set before the log line is written
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 7 and marker.read_text() == "TERM\n"
    assert out == "rank 0 up\n"
