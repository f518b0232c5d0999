"""Slurm (NERSC Perlmutter and most GPU clusters): SLURM_JOB_NODELIST, #SBATCH directives, sbatch / squeue /
scontrol / scancel, and srun as its own launcher."""

from __future__ import annotations

from typing import Callable, Mapping

import hostlist

from sprite import values
from sprite.allocation import Allocation, expand_hosts
from sprite.errors import UsageError
from sprite.schedulers.base import Scheduler


def expand_nodelist(text: str) -> tuple[str, ...]:
    """Expand a Slurm node list (``nid[001-003,007],gpu-[1-2]``). Raises UsageError when it cannot be parsed."""
    try:
        return expand_hosts(text)
    except hostlist.BadHostlist as err:
        raise UsageError(
            f"Cannot read the Slurm node list {text!r} ({err}).",
            "SLURM_JOB_NODELIST was edited or truncated by hand.",
            "Run inside an unmodified Slurm allocation, or unset SLURM_JOB_ID to launch on this machine only.",
        ) from None


def _tasks_per_node(value: str | None) -> int | None:
    # Slurm writes e.g. "4" or "4(x2)" or "4,2"; the first count is the one every full node gets.
    head = (value or "").split(",")[0].split("(")[0]
    return int(head) if head.isdigit() else None


class Slurm(Scheduler):
    name = "slurm"
    label = "Slurm"
    example_spec = "perlmutter.job.yaml"
    submit_program = "sbatch"
    status_program = "squeue"
    script_suffix = ".sbatch"
    auto_launcher = "srun"
    own_launchers = ("srun",)
    block_checks = {"partition": values.name, "constraint": values.token, "gpus_per_node": values.count,
                    "cpus_per_task": values.count}
    client_hint = "Slurm's client commands exist on the login nodes of Slurm sites (Perlmutter)"

    def detect(self, environ: Mapping[str, str]) -> bool:
        return bool(environ.get("SLURM_JOB_ID"))

    def restart_count(self, environ: Mapping[str, str]) -> int:
        # 1 in the first rerun of a requeued job (seen here: `scontrol requeue` with the FACTS.md slurm.conf)
        count = environ.get("SLURM_RESTART_COUNT", "")
        return int(count) if count.isdigit() else 0

    def allocation(self, environ: Mapping[str, str], read: Callable[[str], str], hostname: str) -> Allocation:
        """The hosts of SLURM_JOB_NODELIST. Raises UsageError when the node list is missing or unreadable."""
        text = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST", "")
        if not text:
            raise UsageError(
                f"SLURM_JOB_ID={environ['SLURM_JOB_ID']} is set but SLURM_JOB_NODELIST is empty.",
                "The variable was copied into a shell outside the job.",
                "Run sprite inside the allocation (salloc or an sbatch script), or unset SLURM_JOB_ID.",
            )
        tasks = _tasks_per_node(environ.get("SLURM_NTASKS_PER_NODE") or environ.get("SLURM_TASKS_PER_NODE"))
        return Allocation(self.name, environ["SLURM_JOB_ID"], expand_nodelist(text), tasks)

    def directives(self, block, devices: int) -> list[str]:
        """sbatch directives; ``queue`` is the QOS (``-q``), as on Perlmutter (``-q regular|debug``)."""
        opts = [("job-name", block.job_name), ("account", block.account), ("qos", block.queue),
                ("partition", block.partition), ("constraint", block.constraint), ("nodes", block.nodes),
                ("ntasks-per-node", devices), ("gpus-per-node", block.gpus_per_node),
                ("cpus-per-task", block.cpus_per_task), ("time", block.walltime), ("output", self.log_path(block))]
        if block.dependency:
            opts.append(("dependency", "afterok:" + ":".join(block.dependency)))
        if block.preempt_signal:
            # To every job step (the ranks): Lightning's SLURMEnvironment requeues on SIGUSR1 inside the ranks.
            opts.append(("signal", "{}@{}".format(*block.preempt_signal)))
        lines = [f"#SBATCH --{flag}={values.directive_word(flag, value)}" for flag, value in opts if value is not None]
        if block.requeue is not None:
            lines.append("#SBATCH --requeue" if block.requeue else "#SBATCH --no-requeue")
        return lines + [f"#SBATCH {values.directive_words(item)}" for item in block.extra]

    def log_path(self, block) -> str:
        return f"{block.output_dir}/{block.job_name}-%j.log"

    def pass_env_directives(self, names: tuple[str, ...]) -> list[str]:
        # "--export=ALL,NAME": all of the submitting environment plus NAME with its current value there; names
        # only, a value would be written into the script (sbatch(1) of Slurm 22.05, "--export"). ALL keeps the
        # default propagation the rest of the job relies on (PATH, the venv).
        if not names:
            return []
        return [f"#SBATCH --export={values.directive_word('export', 'ALL,' + ','.join(names))}"]

    def submit_argv(self, program: str, script: str, log_path: str) -> list[str]:
        return [program, "--parsable", script]

    def status(self, job_id, run, program) -> str:
        rows = run([program("squeue"), "-h", "-j", job_id, "-o", "%i %j %T %M %l %D %R"], None).stdout.strip()
        if rows:
            return "JOBID NAME STATE TIME TIME_LIMIT NODES NODELIST(REASON)\n" + rows
        # Finished jobs leave squeue; scontrol keeps them for MinJobAge (sacct needs accounting, often off).
        record = run([program("scontrol"), "-o", "show", "job", job_id], f"scontrol show job {job_id}").stdout
        fields = dict(part.split("=", 1) for part in record.split() if "=" in part)
        return " ".join(f"{key}={fields.get(key, '?')}" for key in ("JobId", "JobName", "JobState", "ExitCode"))

    def cancel_argv(self, job_id, program) -> list[str]:
        return [program("scancel"), job_id]

    def per_node_agents(self, nodes: int, hosts: tuple[str, ...], argv: list[str]) -> list[str]:
        return ["srun", "--nodes", str(nodes), "--ntasks", str(nodes), "--ntasks-per-node", "1",
                "--nodelist", ",".join(hosts), "--kill-on-bad-exit=1", "--export=ALL", *argv]
