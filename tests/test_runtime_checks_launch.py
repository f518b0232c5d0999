"""The fit-start checks in real 2-rank fits on CPU (gloo) through `sprite run --devices 2`.

Five launches of one script (tests/scripts/checks_probe.py), each run once and shared by the tests that read it:
clean (the world block, no warning, one collective), faults (an unsharded IterableDataset, 5-sample validation
and test sets, NCCL_TIMEOUT), the same faults under --no-checks, one fault under --strict, and FSDP1.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import sprite_free_env

PROBE = str(Path(__file__).resolve().parent / "scripts" / "checks_probe.py")
VENV_BIN = str(Path(sys.executable).parent)
STRIP = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "NODE_RANK", "PBS_JOBID", "SLURM_JOB_ID",
         "NCCL_TIMEOUT")
FAULTS = ["--iterable", "--val", "5", "--test", "5"]
RUNS = {  # name: (sprite flags, script flags, extra environment)
    # --preempt-signal none in the runs whose collectives are counted: the preemption check adds its own
    # all-reduce per step (tests/test_preempt_units.py), which is not the fit-start checks' cost.
    "clean": (["--launcher", "mpiexec", "--preempt-signal", "none"], ["--val", "4", "--test", "4"], {}),
    "faults": ([], FAULTS, {"NCCL_TIMEOUT": "600"}),
    "no_checks": (["--no-checks", "--preempt-signal", "none"], FAULTS, {"NCCL_TIMEOUT": "600"}),
    "strict": (["--strict"], ["--val", "5"], {}),
    "fsdp1": ([], ["--fsdp1"], {}),
}

pytestmark = pytest.mark.slow


class Run:
    def __init__(self, proc: subprocess.CompletedProcess, out: Path):
        self.code, self.text = proc.returncode, proc.stdout + proc.stderr
        self.reports = [json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))]

    def lines(self, marker: str) -> list[str]:
        return [line for line in self.text.splitlines() if marker in line]

    def rank_lines(self, marker: str) -> list[str]:
        """The lines the ranks printed: all but the parent's closing `sprite: run succeeded after ...` line."""
        return [line for line in self.lines(marker) if "sprite: run succeeded after " not in line]


@pytest.fixture(scope="module")
def runs(sprite_cmd, tmp_path_factory):
    root, done = tmp_path_factory.mktemp("checks"), {}

    def get(name: str) -> Run:
        if name not in done:
            flags, args, extra = RUNS[name]
            env = sprite_free_env(STRIP)
            env.update(extra, PATH=f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}")
            cmd = [*sprite_cmd, "run", "--devices", "2", "--accelerator", "cpu", *flags, PROBE,
                   "--out", str(root / name), *args]
            proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=300)
            done[name] = Run(proc, root / name)
        return done[name]

    return get


def test_clean_fit_says_the_world_once_and_warns_nothing(runs):
    run = runs("clean")
    assert run.code == 0, run.text[-3000:]
    block = [line.split("sprite: ", 1)[1] for line in run.rank_lines("sprite: ")]
    assert len(block) == 5, block  # world, device, strategy, batch, epoch; printed once, by rank 0 only
    assert block[0] == "world      1 node x 2 ranks per node = 2 ranks (launcher hydra)"
    assert block[1] == "device     cpu, backend gloo"
    assert block[2] == "strategy   XPUDDPStrategy, precision 32-true"
    assert block[3] == "batch      8 per rank x 2 ranks x 2 accumulated = 32 samples per optimizer step"
    # 36 rows: 18 per rank in batches of 8, 8, 2; windows of 2 batches, the last one of 1 batch of 2 rows
    assert block[4].startswith("epoch      3 batch(es) per rank; the last step sees 4 samples, not 32")
    assert not run.lines("sprite: warning")


def test_the_checks_cost_one_small_collective(runs):
    assert [r["sprite_collectives"] for r in runs("clean").reports] == [["all_gather"], ["all_gather"]]
    assert [r["sprite_collectives"] for r in runs("no_checks").reports] == [[], []]


@pytest.mark.parametrize("fault, words", [
    ("unsharded", ["Every rank (2 of 2) got the same first training batch", "IterableDataset"]),
    ("validation", ["The validation set has 5 samples on 2 ranks", "repeats 1 of them", "devices=1",
                    "use_distributed_sampler=False"]),
    ("test", ["The test set has 5 samples on 2 ranks", "repeats 1 of them"]),
    ("timeout", ["NCCL_TIMEOUT='600' is set, but it is not a process-group timeout", "DDPStrategy(timeout=",
                 "--stall-timeout"]),
])
def test_each_fault_is_one_warning_line_on_rank_zero(runs, fault, words):
    run = runs("faults")
    assert run.code == 0 and all(r["finished"] for r in run.reports), run.text[-3000:]
    warnings = run.lines("sprite: warning: ")
    assert len(warnings) == 4 and all(line.startswith("[rank 0] ") for line in warnings), warnings
    assert sum(all(w in line for w in words) for line in warnings) == 1, (fault, warnings)


def test_no_checks_silences_the_block_and_every_warning(runs):
    run = runs("no_checks")
    assert run.code == 0 and len(run.reports) == 2, run.text[-3000:]
    assert not run.rank_lines("sprite: ")
    assert len(run.lines("sprite: run succeeded after 1 attempt(s)")) == 1


def test_strict_turns_a_warning_into_exit_2(runs):
    run = runs("strict")
    assert run.code == 2, run.text[-3000:]
    errors = run.lines("The validation set has 5 samples on 2 ranks")
    assert errors and all("(an error because of --strict)" in line for line in errors), run.text[-3000:]
    assert not run.lines("sprite: warning: ") and not run.reports and "Traceback" not in run.text, run.text[-3000:]


def test_lightning_fsdp1_is_refused_before_the_process_group(runs):
    run = runs("fsdp1")
    assert run.code == 2, run.text[-3000:]
    refused = run.lines("The script builds Lightning's FSDPStrategy in a sprite launch of 2 ranks.")
    assert refused and all("sprite launches DDP and FSDP2 only" in line for line in refused)
    assert "Initializing distributed" not in run.text and "Traceback" not in run.text and not run.reports
