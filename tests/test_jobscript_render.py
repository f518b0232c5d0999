"""Rendered job scripts: golden files for the shipped site examples, bash -n, and every example renders as is.

Golden files hold @REPO@, @PYTHON@ and @CWD@ for the paths of this checkout, interpreter and working directory.
Regenerate after a reviewed change with SPRITE_UPDATE_GOLDEN=1.
"""

from __future__ import annotations

import os
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest

from sprite.jobs import submit

REPO = Path(__file__).resolve().parents[1]
GOLDEN = Path(__file__).parent / "golden"
CASES = [("aurora", "pbs", "aurora.pbs"), ("polaris", "pbs", "polaris.pbs"),
         ("perlmutter", "slurm", "perlmutter.sbatch"), ("local", "slurm", "local.sbatch"), ("local", "pbs", "local.pbs")]


def normalised(text: str, cwd: Path) -> str:
    return text.replace(str(cwd), "@CWD@").replace(sys.executable, "@PYTHON@").replace(str(REPO), "@REPO@")


@pytest.mark.parametrize("site,kind,golden", CASES)
def test_site_example_matches_golden_and_is_valid_bash(site, kind, golden, tmp_path):
    text = submit.prepare(str(REPO / "conf" / f"{site}.job.yaml"), kind, cwd=str(tmp_path)).text
    got = normalised(text, tmp_path)
    if os.environ.get("SPRITE_UPDATE_GOLDEN"):
        (GOLDEN / golden).write_text(got)
    assert got == (GOLDEN / golden).read_text()
    script = tmp_path / golden
    script.write_text(text)
    check = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert check.returncode == 0, check.stderr


def test_site_directives_are_the_documented_ones(tmp_path):
    aurora = submit.prepare(str(REPO / "conf" / "aurora.job.yaml"), "pbs", cwd=str(tmp_path)).text
    for line in ("#PBS -l select=2", "#PBS -l place=scatter", "#PBS -l filesystems=home:flare", "#PBS -q debug",
                 "#PBS -A MyProject", "#PBS -l walltime=00:30:00"):
        assert line + "\n" in aurora
    polaris = submit.prepare(str(REPO / "conf" / "polaris.job.yaml"), "pbs", cwd=str(tmp_path)).text
    assert "#PBS -l select=2:system=polaris\n" in polaris and "#PBS -l filesystems=home:eagle\n" in polaris
    perl = submit.prepare(str(REPO / "conf" / "perlmutter.job.yaml"), "slurm", cwd=str(tmp_path)).text
    for line in ("--constraint=gpu", "--qos=regular", "--gpus-per-node=4", "--account=m0000_g", "--nodes=2",
                 "--ntasks-per-node=4", "--signal=B:USR1@90", "--open-mode=append", "--requeue"):
        assert f"#SBATCH {line}\n" in perl


@pytest.mark.parametrize("name,cmd", [("aurora.job.yaml", "qsub"), ("polaris.job.yaml", "qsub"),
                                      ("perlmutter.job.yaml", "sbatch"), ("local.job.yaml", "sbatch"),
                                      ("local", "qsub")])
def test_shipped_examples_render_by_name_from_another_folder(name, cmd, sprite_cmd, tmp_path):
    done = subprocess.run([*sprite_cmd, cmd, "--dry-run", name], cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("#!/bin/bash\n")
    # the job runs this very interpreter: the same environment's bin (`sprite` may name it python3 where pytest
    # runs as python, links to one file)
    line = next(line for line in done.stdout.splitlines() if line.startswith("exec "))
    program, rest = line[len("exec "):].split(" ", 1)
    assert os.path.dirname(program) == os.path.dirname(sys.executable), line
    assert os.path.samefile(program, sys.executable) and rest.startswith("-m sprite run --site "), line
    assert not (tmp_path / "sprite-jobs").exists()  # --dry-run writes nothing


def test_local_example_runs_the_shipped_example_on_two_ranks(tmp_path):
    text = submit.prepare("local.job.yaml", "slurm", cwd=str(tmp_path)).text
    assert "#SBATCH --ntasks-per-node=2\n" in text
    # The spec's ../examples/train.py resolves beside the installed conf/ (the repo's, in an editable install).
    shipped = Path(str(resources.files("sprite.examples") / "train.py")).resolve()
    assert f"--devices 2 --accelerator cpu --strategy ddp {shipped} --max-steps 5" in text
