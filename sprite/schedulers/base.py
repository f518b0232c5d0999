"""The interface every batch system implements: what PBS or Slurm means to sprite, in one class each.

Modelled on Lightning's cluster environments (``lightning/fabric/plugins/environments/*.py``): one small class
per system with ``detect()``. Code outside ``sprite/schedulers/`` asks the scheduler object instead of
branching on its name. A new system (LSF, Flux) is one new module here, one registry line in ``__init__.py``
and a site profile; ``tests/test_schedulers.py`` lists what it must provide.
"""

from __future__ import annotations

import subprocess
from typing import Callable, Mapping

from sprite.allocation import Allocation


class Scheduler:
    """A batch system. Class attributes describe it; methods read its allocation and talk to its clients."""

    name: str = ""  # the site profile's ``scheduler:`` value
    label: str = ""  # how people write it (PBS, Slurm)
    example_spec: str = ""  # a shipped example job spec for this system (--help)
    submit_program: str | None = None  # qsub, sbatch; None when jobs cannot be submitted
    status_program: str | None = None  # the client whose presence on PATH means "this system is here"
    script_suffix: str = ".sh"
    auto_launcher: str = "local"  # what ``--launcher auto`` means inside its allocation
    own_launchers: tuple[str, ...] = ()  # launchers that work only inside this system's allocation (srun)
    block_checks: dict = {}  # scheduler-block keys only this system understands -> their value checker
    client_hint: str = ""

    def detect(self, environ: Mapping[str, str]) -> bool:
        """True when ``environ`` is that of a process inside this system's job."""
        return False

    def restart_count(self, environ: Mapping[str, str]) -> int:
        """How many times the system has started this job again (a requeue); 0 for its first run."""
        return 0

    def allocation(self, environ: Mapping[str, str], read: Callable[[str], str], hostname: str) -> Allocation:
        """The hosts this job was granted. Raises UsageError when the job's variables are unusable."""
        raise NotImplementedError

    def directives(self, block, devices: int) -> list[str]:
        """The job script's directive lines for a SchedulerBlock. Raises UsageError for an unsafe value."""
        raise NotImplementedError

    def log_path(self, block) -> str:
        """Where the system writes the job's output."""
        raise NotImplementedError

    def pass_env_directives(self, names: tuple[str, ...]) -> list[str]:
        """Directive lines that give the job ``names`` with their values in the submitting environment (the values
        are never written). Without them a job sees only what the system passes by default, and ``sprite run``
        inside it refuses a listed variable that is missing, naming it."""
        return []

    def launch_lines(self, block, command: str) -> list[str]:
        """Job-script lines that run the (already shell-quoted) ``sprite run`` command."""
        return [f"exec {command}"]

    def submit_argv(self, program: str, script: str, log_path: str) -> list[str]:
        """The submit command line for a written job script."""
        raise NotImplementedError

    def parse_job_id(self, stdout: str) -> str:
        """The job id from the submit command's output ("" when it printed none)."""
        lines = stdout.strip().splitlines()
        return lines[-1].split()[-1].split(";")[0] if lines else ""

    def status(self, job_id: str, run: Callable[[list[str], str], subprocess.CompletedProcess],
               program: Callable[[str], str]) -> str:
        """The system's view of ``job_id``. ``run(argv, what)`` raises UsageError when a client fails."""
        raise NotImplementedError

    def cancel_argv(self, job_id: str, program: Callable[[str], str]) -> list[str]:
        """The command that cancels ``job_id``."""
        raise NotImplementedError

    def per_node_agents(self, nodes: int, hosts: tuple[str, ...], argv: list[str]) -> list[str]:
        """``argv`` started once on each of ``hosts`` (one torchrun agent per node) by this system's launcher."""
        return ["mpiexec", "-n", str(nodes), "--ppn", "1", "--hosts", ",".join(hosts), "--envall", *argv]
