"""PBS Pro (ALCF Aurora and Polaris): allocation from PBS_NODEFILE, #PBS directives, qsub / qstat / qdel.

Directives follow ALCF's job-script examples (``-l select``, ``place``, ``walltime``, ``filesystems``). Values
were checked to be directive-safe tokens when the block was validated; ``directive_word`` checks again.
"""

from __future__ import annotations

from typing import Callable, Mapping

from sprite import values
from sprite.allocation import Allocation, unique
from sprite.errors import UsageError
from sprite.schedulers.base import Scheduler


class PBS(Scheduler):
    name = "pbs"
    label = "PBS"
    example_spec = "aurora.job.yaml"
    submit_program = "qsub"
    status_program = "qstat"
    script_suffix = ".pbs"
    auto_launcher = "mpiexec"
    block_checks = {"filesystems": values.names, "place": values.place, "select": values.token}
    client_hint = "PBS Pro's client commands exist on the login nodes of PBS sites (Aurora, Polaris)"

    def detect(self, environ: Mapping[str, str]) -> bool:
        return bool(environ.get("PBS_JOBID"))

    def allocation(self, environ: Mapping[str, str], read: Callable[[str], str], hostname: str) -> Allocation:
        """The hosts of PBS_NODEFILE (one line per rank slot, so hosts repeat). Raises UsageError if unusable."""
        path = environ.get("PBS_NODEFILE", "")
        try:
            hosts = unique(read(path).splitlines()) if path else ()
        except OSError as err:
            raise UsageError(
                f"PBS_NODEFILE={path} cannot be read ({err.strerror}).",
                "The job's node file is only present on the job's own nodes.",
                "Run sprite inside the PBS job (qsub -I or a job script).",
            ) from None
        if not hosts:
            raise UsageError(
                f"PBS_JOBID={environ['PBS_JOBID']} is set but PBS_NODEFILE names no hosts.",
                "The variable was copied into a shell outside the job, or the node file is empty.",
                "Run sprite inside the PBS job, or unset PBS_JOBID to launch on this machine only.",
            )
        return Allocation(self.name, environ["PBS_JOBID"], hosts, None, path)

    def directives(self, block, devices: int) -> list[str]:
        del devices  # PBS Pro gives whole nodes; ranks per node are sprite run's business (mpiexec --ppn)
        opts = [("-N", block.job_name), ("-A", block.account), ("-q", block.queue)]
        select = f"select={block.nodes}" + (f":{block.select}" if block.select else "")
        opts += [("-l", select), ("-l", f"place={block.place}" if block.place else None),
                 ("-l", f"walltime={block.walltime}")]
        if block.filesystems:
            opts.append(("-l", "filesystems=" + ":".join(block.filesystems)))
        opts += [("-o", self.log_path(block)), ("-j", "oe")]
        if block.requeue is not None:
            opts.append(("-r", "y" if block.requeue else "n"))
        if block.dependency:
            opts.append(("-W", "depend=afterok:" + ":".join(block.dependency)))
        lines = [f"#PBS {flag} {values.directive_word(flag, value)}" for flag, value in opts if value is not None]
        return lines + [f"#PBS {values.directive_words(item)}" for item in block.extra]

    def log_path(self, block) -> str:
        return f"{block.output_dir}/{block.job_name}.log"

    def pass_env_directives(self, names: tuple[str, ...]) -> list[str]:
        # "-v NAME": NAME and its value in qsub's environment are added to the job's Variable_List (qsub(1B) of
        # PBS Professional, openpbs doc/man1/qsub.1B); by default PBS exports only the PBS_O_* variables.
        return [f"#PBS -v {values.directive_word('v', ','.join(names))}"] if names else []

    def launch_lines(self, block, command: str) -> list[str]:
        if not block.preempt_signal:
            return super().launch_lines(block, command)
        # PBS Pro has no directive for an early warning signal, so the script sends it itself `delay` seconds
        # into the job; the timer's output goes to /dev/null so it never holds the job's output open.
        signal, before = block.preempt_signal
        delay = max(1, values.seconds(block.walltime) - before)
        return [
            f"{command} &",
            "sprite_pid=$!",
            f"( sleep {delay} && kill -s {signal} \"$sprite_pid\" ) >/dev/null 2>&1 &",
            "timer_pid=$!",
            "status=0",
            "wait \"$sprite_pid\" || status=$?",
            "kill \"$timer_pid\" 2>/dev/null || true",
            "exit \"$status\"",
        ]

    def submit_argv(self, program: str, script: str, log_path: str) -> list[str]:
        # -o/-j repeat the directives: Slurm's PBS-compatible qsub reads options only from its command line.
        return [program, "-o", log_path, "-j", "oe", script]

    def status(self, job_id, run, program) -> str:
        return run([program("qstat"), job_id], f"qstat {job_id}").stdout.rstrip()

    def cancel_argv(self, job_id, program) -> list[str]:
        return [program("qdel"), job_id]
