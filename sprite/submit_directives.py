"""The ``#PBS`` and ``#SBATCH`` lines of a job script, from a SchedulerBlock.

Values were checked to be directive-safe tokens (submit_values.TOKEN) when the block was validated; here each
is still passed through ``shlex.quote`` and must come back unchanged, so a token that would need quoting can
never reach a directive even if a caller skipped validation.
"""

from __future__ import annotations

import shlex

from sprite.errors import UsageError
from sprite.scheduler_spec import SchedulerBlock


def plain(key: str, value) -> str:
    """``value`` as text that needs no quoting. Raises UsageError naming ``key`` otherwise."""
    text = str(value)
    if shlex.quote(text) != text or not text:
        raise UsageError(
            f"scheduler.{key} = {text!r} cannot be written into a job-script directive.",
            "qsub and sbatch read directives with their own parsers, so quoting cannot protect spaces, "
            "quotes, $ or control characters there.",
            "Use letters, digits and _ . , : = @ % + / - only.",
        )
    return text


def log_path(block: SchedulerBlock) -> str:
    """Where the scheduler writes the job's output (``%j`` is the Slurm job id)."""
    suffix = ".log" if block.kind == "pbs" else "-%j.log"
    return f"{block.output_dir}/{block.job_name}{suffix}"


def pbs(block: SchedulerBlock, devices: int) -> list[str]:
    """PBS Pro directives as in ALCF's job-script examples (select, place, walltime, filesystems)."""
    del devices  # PBS Pro gives whole nodes; ranks per node are sprite run's business (mpiexec --ppn)
    opts = [("-N", block.job_name), ("-A", block.account), ("-q", block.queue)]
    select = f"select={block.nodes}" + (f":{block.select}" if block.select else "")
    opts += [("-l", select), ("-l", f"place={block.place}" if block.place else None),
             ("-l", f"walltime={block.walltime}")]
    if block.filesystems:
        opts.append(("-l", "filesystems=" + ":".join(block.filesystems)))
    opts += [("-o", log_path(block)), ("-j", "oe")]
    if block.requeue is not None:
        opts.append(("-r", "y" if block.requeue else "n"))
    if block.dependency:
        opts.append(("-W", "depend=afterok:" + ":".join(block.dependency)))
    lines = [f"#PBS {flag} {plain(flag, value)}" for flag, value in opts if value is not None]
    return lines + [f"#PBS {' '.join(plain('extra', word) for word in item.split(' '))}" for item in block.extra]


def slurm(block: SchedulerBlock, devices: int) -> list[str]:
    """sbatch directives; ``queue`` is the QOS (``-q``), as on Perlmutter (``-q regular|debug``)."""
    opts = [("job-name", block.job_name), ("account", block.account), ("qos", block.queue),
            ("partition", block.partition), ("constraint", block.constraint), ("nodes", block.nodes),
            ("ntasks-per-node", devices), ("gpus-per-node", block.gpus_per_node),
            ("cpus-per-task", block.cpus_per_task), ("time", block.walltime), ("output", log_path(block))]
    if block.dependency:
        opts.append(("dependency", "afterok:" + ":".join(block.dependency)))
    if block.preempt_signal:
        # To every job step (the ranks): Lightning's SLURMEnvironment requeues on SIGUSR1 inside the ranks.
        opts.append(("signal", "{}@{}".format(*block.preempt_signal)))
    lines = [f"#SBATCH --{flag}={plain(flag, value)}" for flag, value in opts if value is not None]
    if block.requeue is not None:
        lines.append("#SBATCH --requeue" if block.requeue else "#SBATCH --no-requeue")
    return lines + [f"#SBATCH {' '.join(plain('extra', word) for word in item.split(' '))}" for item in block.extra]
