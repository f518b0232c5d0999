"""A rank that fails while its peers go on: under MPICH Hydra's mpiexec, which does not end the other ranks when
one exits non-zero, sprite run stops the launch FAILED_GRACE seconds after the failing rank's heartbeat said so,
instead of leaving the others to their backend's timeout (a peer in an NCCL collective waits 30 min)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import LEAK_GUARDED, SCHEDULER_VARS, sprite_free_env

pytestmark = pytest.mark.slow
SLEEP = 150  # rank 0's step 2: much longer than the grace, so only sprite's stop ends the attempt in time

SCRIPT = '''
import os, time
import lightning as L, torch
from torch.utils.data import DataLoader, TensorDataset

class M(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(4, 1)
    def training_step(self, batch, batch_idx):
        if self.global_step == 2:
            if self.global_rank == 1:
                raise RuntimeError("rank 1 fails at step 2 on purpose")
            time.sleep(%d)  # rank 0 is busy: no collective tells it that rank 1 has gone
        return self.net(batch[0]).pow(2).mean()
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

L.Trainer(max_steps=4, logger=False, enable_checkpointing=False, enable_progress_bar=False,
          enable_model_summary=False).fit(M(), DataLoader(TensorDataset(torch.randn(64, 4)), batch_size=4))
''' % SLEEP


def _env() -> dict:
    """No launcher or scheduler variables of this machine; MPICH's mpiexec (the venv's) first on PATH."""
    env = sprite_free_env((*LEAK_GUARDED, *SCHEDULER_VARS))
    return {**env, "PATH": os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])}


def test_a_rank_that_failed_ends_the_launch_its_launcher_leaves_running(sprite_cmd, tmp_path):
    from sprite.recovery.watchdog import FAILED_GRACE

    script = tmp_path / "fail_fit.py"
    script.write_text(SCRIPT)
    env = _env()
    run_dir = tmp_path / "run"
    start = time.monotonic()
    done = subprocess.run([*sprite_cmd, "run", "--devices", "2", "--accelerator", "cpu", "--launcher", "mpiexec",
                           "--mpi", "hydra", "--run-dir", str(run_dir), str(script)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=SLEEP + 120)
    took = time.monotonic() - start
    assert done.returncode not in (0, 124), done.stderr[-3000:]
    records = [json.loads(line) for line in (run_dir / "audit.jsonl").read_text().splitlines()]
    stop = next((r for r in records if r["kind"] == "failure_stop"), None)
    assert stop is not None, done.stderr[-3000:]
    assert "rank(s) 1 failed" in stop["reason"] and "rank 0" in stop["reason"], stop
    assert "Stopped the launch: rank(s) 1 failed" in done.stderr
    end = next(r for r in records if r["kind"] == "attempt_end")
    assert end["cause"] == "application fault", end  # the failing rank's error, not a stall or a node fault
    assert "RuntimeError: rank 1 fails at step 2 on purpose" in (run_dir / "attempt-1.log").read_text()
    assert took < SLEEP - 30 and took > FAILED_GRACE, took  # stopped after the grace, long before rank 0 woke


def test_a_fit_lightning_stopped_on_sigterm_is_not_reported_finished(sprite_cmd, tmp_path):
    """Lightning answers SIGTERM (a scheduler's time limit, scancel) by raising SIGTERMException, a SystemExit with
    no code, from its loop: the rank would exit 0, and srun, which returns its ranks' codes, would make the cut-short
    fit a success. The rank exits 143 (128 + SIGTERM) instead. The script raises it as Lightning's loop does."""
    script = tmp_path / "stopped.py"
    script.write_text("import lightning\nfrom lightning.pytorch.utilities.exceptions import SIGTERMException\n"
                      "raise SIGTERMException()\n")
    env = _env()
    run_dir = tmp_path / "run"
    done = subprocess.run([*sprite_cmd, "run", "--devices", "1", "--accelerator", "cpu", "--run-dir", str(run_dir),
                           str(script)], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0, done.stderr[-3000:]
    end = next(json.loads(line) for line in (run_dir / "audit.jsonl").read_text().splitlines()
               if json.loads(line)["kind"] == "attempt_end")
    assert end["exit_code"] == 143 and end["cause"] != "success", end
    assert json.loads((run_dir / "run.json").read_text())["status"] != "succeeded"
