"""The interface every batch system implements: what PBS or Slurm means to sprite, in one class each.

Modelled on Lightning's cluster environments (``lightning/fabric/plugins/environments/*.py``): one small class
per system with ``detect()``. Code outside ``sprite/schedulers/`` asks the scheduler object instead of
branching on its name. A new system (LSF, Flux) is one new module here, one registry line in ``__init__.py``
and a site profile; ``tests/test_schedulers.py`` lists what it must provide.
"""

from __future__ import annotations

import json
import subprocess
from typing import Callable, Mapping

from sprite.schedulers.allocation import Allocation
from sprite.errors import UsageError


def loads(text: str):
    """``json.loads`` of a client's output that raises only ValueError, also for nesting deeper than the parser
    goes (RecursionError) and for integers of over 4,300 digits."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("JSON nested too deeply") from None


class Scheduler:
    """A batch system. Class attributes describe it; methods read its allocation and talk to its clients."""

    name: str = ""  # the site profile's ``scheduler:`` value
    job_variable: str = ""  # the variable whose presence means "inside this system's job" (PBS_JOBID)
    label: str = ""  # how people write it (PBS, Slurm)
    example_spec: str = ""  # a shipped example job spec for this system (--help)
    submit_program: str | None = None  # qsub, sbatch; None when jobs cannot be submitted
    status_program: str | None = None  # the client whose presence on PATH means "this system is here"
    script_suffix: str = ".sh"
    auto_launcher: str = "local"  # what ``--launcher auto`` means inside its allocation
    own_launchers: tuple[str, ...] = ()  # launchers that work only inside this system's allocation (srun)
    block_checks: dict = {}  # scheduler-block keys only this system understands -> their value checker
    client_hint: str = ""
    max_signal_lead: int | None = None  # the most seconds before the walltime a warning signal may be asked for
    owned_options: dict = {}  # directive options sprite writes itself -> the scheduler-block key that sets them
    requeue_options: dict = {}  # options sprite writes for requeue: true -> why (an extra item may not override)

    def detect(self, environ: Mapping[str, str]) -> bool:
        """True when ``environ`` is that of a process inside this system's job."""
        return bool(self.job_variable and environ.get(self.job_variable))

    def owner_of(self, option: str) -> str | None:
        """The key that sets the directive ``option`` (an ``extra`` item) in sprite's own directives, else None.

        ``--time=1:00``, ``-t 60`` and ``-l select=2,walltime=72:00:00`` (each resource of -l and -W) are found.
        """
        head, _, rest = option.partition(" ")
        if head.startswith("--"):
            return self.owned_options.get(head.split("=")[0])
        flag, rest = head[:2], head[2:] or rest
        if flag in ("-l", "-W"):
            names = (item.split("=")[0] for item in rest.split(","))
            return next((self.owned_options[f"{flag} {n}"] for n in names if f"{flag} {n}" in self.owned_options),
                        None)
        return self.owned_options.get(flag)

    def requested_allocation(self, hosts: tuple[str, ...], ranks_per_node: int) -> Allocation:
        """The allocation a job script asks for, as ``sprite run`` inside the job will see it (for planning)."""
        return Allocation(self.name, "planned", hosts, None, None, planned=True)

    def restart_count(self, environ: Mapping[str, str]) -> int:
        """How many times the system has started this job again (a requeue); 0 for its first run."""
        return 0

    def requeue_argv(self, environ: Mapping[str, str], program: Callable[[str], str]) -> list[str]:
        """The command, run inside this job by ``sprite run --requeue`` after every rank saved a checkpoint and
        stopped for preemption (exit 75), that makes the system run the job again; the job script passes
        ``--resume auto``, so the run that comes back continues from that checkpoint. ``program(name)`` is the
        client's path.

        Raises:
            UsageError: this system cannot run the job again from inside it.
        """
        raise UsageError(f"{self.label or 'This machine'} cannot run a job again: there is no batch job here.",
                         "--requeue is for job scripts written by sprite qsub / sprite sbatch.", "Drop --requeue.")

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
        """The job id from the submit command's output ("" when it printed none): the last word of its last line
        that starts with a digit, as both systems' ids start with the job's number (Slurm's "Submitted batch job
        123", "... 123 on cluster c1" under --clusters, --parsable's "123;cluster"; PBS's "123.server"). Output
        without one ("all good") names no job."""
        words = stdout.strip().splitlines()[-1].split() if stdout.strip() else []
        return next((word.split(";")[0] for word in reversed(words) if word[:1].isdigit()), "")

    def status(self, job_id: str, run: Callable[[list[str], str], subprocess.CompletedProcess],
               program: Callable[[str], str]) -> str:
        """The system's view of ``job_id``. ``run(argv, what)`` raises UsageError when a client fails."""
        raise NotImplementedError

    def status_record(self, job_id: str, run: Callable[[list[str], str], subprocess.CompletedProcess],
                      program: Callable[[str], str]) -> dict:
        """The system's own JSON view of ``job_id`` as one record: scheduler, job_id, name, state, reason,
        exit_code, nodes, log, source (the command it came from). Raises UsageError when a client fails."""
        raise NotImplementedError

    def cancel_argv(self, job_id: str, program: Callable[[str], str]) -> list[str]:
        """The command that cancels ``job_id``."""
        raise NotImplementedError

    def per_node_agents(self, nodes: int, hosts: tuple[str, ...], argv: list[str]) -> list[str]:
        """``argv`` started once on each of ``hosts`` (one torchrun agent per node) by this system's own launcher
        (``own_launchers``); a system without one has the site's mpiexec start them (``launchers._torchrun``)."""
        raise NotImplementedError
