"""What a batch system must provide to sprite, shown by the two it has and by a new one added in a test.

Adding LSF or Flux is one module in sprite/schedulers/ (a Scheduler subclass), one registry line and a site
profile naming it; FakeLSF below is such a module, named as a fake (no LSF runs here).
"""

from __future__ import annotations

from importlib import resources

import pytest

from sprite import schedulers
from sprite.values import scheduler as scheduler_values
from sprite.jobs import submit
from sprite.schedulers.allocation import Allocation
from sprite.schedulers.base import Scheduler


class FakeLSF(Scheduler):
    """A fake LSF: just enough to plan, render and submit a job (nothing runs)."""

    name = "lsf"
    label = "LSF"
    example_spec = "lsf.job.yaml"
    submit_program = "bsub"
    status_program = "bjobs"
    script_suffix = ".lsf"
    auto_launcher = "mpiexec"
    block_checks = {"project_group": scheduler_values.name}

    def detect(self, environ):
        return bool(environ.get("LSB_JOBID"))

    def allocation(self, environ, read, hostname):
        return Allocation(self.name, environ["LSB_JOBID"], tuple(environ["LSB_HOSTS"].split()))

    def directives(self, block, devices):
        return [f"#BSUB -J {block.job_name}", f"#BSUB -nnodes {block.nodes}", f"#BSUB -W {block.walltime}",
                f"#BSUB -G {block.options['project_group']}"]

    def log_path(self, block):
        return f"{block.output_dir}/{block.job_name}.%J.log"

    def submit_argv(self, program, script, log_path):
        return [program, script]

    def cancel_argv(self, job_id, program):
        return [program("bkill"), job_id]


@pytest.mark.parametrize("scheduler", schedulers.batch(), ids=lambda s: s.name)
def test_every_batch_system_provides_the_interface(scheduler):
    assert scheduler.name and scheduler.label and scheduler.submit_program and scheduler.status_program
    assert scheduler.job_variable and scheduler.detect({scheduler.job_variable: "1"})  # what detect() looks for
    assert scheduler.script_suffix.startswith(".")
    assert (resources.files("sprite.conf") / scheduler.example_spec).is_file()
    for method in ("allocation", "directives", "log_path", "submit_argv", "status", "cancel_argv"):
        assert getattr(type(scheduler), method) is not getattr(Scheduler, method), method
    others = [key for s in schedulers.batch() if s is not scheduler for key in s.block_checks]
    assert not set(scheduler.block_checks) & set(others)


def test_detection_order_and_the_fallback():
    assert schedulers.detect({"PBS_JOBID": "1", "SLURM_JOB_ID": "2"}).name == "pbs"
    assert schedulers.detect({"SLURM_JOB_ID": "2"}).name == "slurm"
    assert schedulers.detect({}) is schedulers.NONE


def test_a_new_scheduler_is_one_class_and_a_site_profile(monkeypatch, tmp_path):
    batch = {name: s for name, s in schedulers.REGISTRY.items() if s is not schedulers.NONE}
    monkeypatch.setattr(schedulers, "REGISTRY", {**batch, "lsf": FakeLSF(), "none": schedulers.NONE})
    site = tmp_path / "summitlike.yaml"
    site.write_text("scheduler: lsf\nmpi: hydra\njob: {devices: 6}\nsubmit: {walltime: '00:10:00'}\n")
    (tmp_path / "train.py").write_text("print('hi')\n")
    spec = tmp_path / "job.yaml"
    spec.write_text(f"site: {site}\nscript: train.py\nnodes: 2\nscheduler: {{project_group: abc}}\n")
    prepared = submit.prepare(str(spec), "lsf", cwd=str(tmp_path))
    assert prepared.script_path.endswith("/sprite-jobs/job-1.lsf")  # a new name for every submission
    assert "#BSUB -nnodes 2\n#BSUB -W 00:10:00\n#BSUB -G abc" in prepared.text
    assert "# Written by `sprite bsub`" in prepared.text and "(mpiexec under LSF)" in prepared.text
    alloc = schedulers.detect({"LSB_JOBID": "77", "LSB_HOSTS": "h1 h1 h2"}).allocation(
        {"LSB_JOBID": "77", "LSB_HOSTS": "h1 h2"}, None, "here")
    assert alloc.scheduler == "lsf" and alloc.hosts == ("h1", "h2")
