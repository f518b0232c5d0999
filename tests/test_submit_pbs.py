"""The rendered Aurora PBS script, run by bash in a PBS-like environment, starts 2 ranks to completion.

No PBS server exists here: PBS_JOBID and PBS_NODEFILE are set by hand, and tests/fakes/pals_mpiexec (a FAKE
PALS mpiexec that translates PALS flags and execs MPICH's real Hydra mpiexec) stands first on PATH as mpiexec.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from sprite.jobs import submit

REPO = Path(__file__).resolve().parents[1]
FAKE = Path(__file__).parent / "fakes" / "pals_mpiexec"
HYDRA = Path(sys.executable).parent / "mpiexec"


@pytest.mark.slow
@pytest.mark.parametrize("copies", [2, 1])
def test_aurora_script_runs_two_ranks_under_pals_stand_in(copies, tmp_path, clean_env):
    if not HYDRA.exists():
        pytest.fail(f"MPICH Hydra mpiexec is missing at {HYDRA}: pip install mpich (the test extra)")
    out = tmp_path / "ranks"
    spec = {"site": "aurora", "script": str(REPO / "examples" / "train.py"), "nodes": 1, "devices": 2,
            "accelerator": "cpu", "strategy": "ddp", "precision": "32-true",
            "args": ["--max-steps", "3", "--out", str(out)],
            "scheduler": {"account": "MyProject", "queue": "debug", "walltime": "00:10:00",
                          "preempt_signal": "USR1@60"}}
    (tmp_path / "cpu.job.yaml").write_text(yaml.safe_dump(spec))
    prepared = submit.prepare(str(tmp_path / "cpu.job.yaml"), "pbs", cwd=str(tmp_path))
    assert "#PBS -l filesystems=home:flare" in prepared.text and "--site aurora" in prepared.text
    script = tmp_path / "job.pbs"
    script.write_text(prepared.text)

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "mpiexec").symlink_to(FAKE)
    nodefile = tmp_path / "nodefile"
    nodefile.write_text((socket.gethostname() + "\n") * copies)
    # On Aurora the rendezvous host is the first node's high-speed-network name (<host>.hsn.cm.aurora.alcf.anl.gov,
    # the profile's rendezvous_domain); that name does not resolve here, so the fake PALS gives the ranks the host's
    # own name (tests/fakes/pals_mpiexec).
    env = {**clean_env, "PBS_JOBID": "4242.aurora-pbs-fake", "PBS_NODEFILE": str(nodefile),
           "REAL_MPIEXEC": str(HYDRA), "PATH": f"{bin_dir}{os.pathsep}{clean_env.get('PATH', '')}"}
    done = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=240)
    log = done.stdout[-3000:] + done.stderr[-3000:]
    assert done.returncode == 0, log
    assert sorted(p.name for p in out.glob("rank*.json")) == ["rank0.json", "rank1.json"], log
    assert re.search(r"rank 0/2: final loss", log) and re.search(r"rank 1/2: final loss", log), log


def test_fake_pals_refuses_flags_it_does_not_know(tmp_path):
    done = subprocess.run([str(FAKE), "--no-such-flag", "x"], env={**os.environ, "REAL_MPIEXEC": "/bin/true"},
                          capture_output=True, text=True)
    assert done.returncode == 2 and "unsupported flag" in done.stderr
