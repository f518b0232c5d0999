"""PBS Pro (ALCF Aurora and Polaris): allocation from PBS_NODEFILE, #PBS directives, qsub / qstat / qdel.

Directives follow ALCF's job-script examples (``-l select``, ``place``, ``walltime``, ``filesystems``). Values
were checked to be directive-safe tokens when the block was validated; ``directive_word`` checks again.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Callable, Mapping

from sprite import contract
from sprite.values import scheduler as sv
from sprite.schedulers.allocation import Allocation, check_hosts, check_job_id
from sprite.errors import UsageError, one_line
from sprite.schedulers.base import Scheduler, loads

REQUEUE_COUNT = "SPRITE_REQUEUE_COUNT"  # given to a resubmitted job by requeue_argv: how many runs came before


# The status record's query: -x adds finished jobs from the server's job history; -f -F json, every field as JSON.
QSTAT_JSON = "qstat -x -f -F json"

# PBS Pro's one-letter job states (qstat(1B), "Job states").
STATES = {"B": "BEGUN", "E": "EXITING", "F": "FINISHED", "H": "HELD", "M": "MOVED", "Q": "QUEUED", "R": "RUNNING",
          "S": "SUSPENDED", "T": "TRANSIT", "U": "USER_SUSPENDED", "W": "WAITING", "X": "EXPIRED"}


def parse_qstat_json(text: str, job_id: str) -> dict | None:
    """The normalised record of ``job_id`` in ``qstat -x -f -F json`` output (None if absent). Job keys carry the
    server name ("123.aurora-pbs-0001..."), so a bare number matches the key's first part. A field of another
    type than PBS Pro writes is read as absent (None).

    Raises ValueError when ``text`` is not PBS Pro's JSON (not a mapping of job mappings).
    """
    data = loads(text)
    jobs = data.get("Jobs", {}) if isinstance(data, dict) else None
    if not isinstance(jobs, dict):
        raise ValueError("no 'Jobs' mapping")
    for key, job in jobs.items():
        if key == job_id or key.split(".")[0] == job_id:
            if not isinstance(job, dict):
                raise ValueError(f"job {key} is no mapping")
            code, state, log = job.get("Exit_status"), _text(job.get("job_state")), _text(job.get("Output_Path"))
            return {"scheduler": "pbs", "job_id": key, "name": _text(job.get("Job_Name")),
                    "state": STATES.get(state, state), "reason": _text(job.get("comment")),
                    "exit_code": code if type(code) is int else None, "nodes": _text(job.get("exec_host")),
                    "log": log.split(":", 1)[-1] or None if log else None, "queue": _text(job.get("queue")),
                    "account": _text(job.get("Account_Name")), "source": QSTAT_JSON}
    return None


def _text(value) -> str | None:
    """A client's text field: a string as it is, anything else (a number, a list, null) as absent."""
    return value if isinstance(value, str) else None


class PBS(Scheduler):
    name = "pbs"
    job_variable = "PBS_JOBID"
    label = "PBS"
    example_spec = "aurora.job.yaml"
    submit_program = "qsub"
    status_program = "qstat"
    script_suffix = ".pbs"
    auto_launcher = "mpiexec"
    block_checks = {"filesystems": sv.names, "place": sv.place, "select": sv.select}
    client_hint = "PBS Pro's client commands exist on the login nodes of PBS sites (Aurora, Polaris)"
    owned_options = {"-N": "job_name", "-A": "account", "-q": "queue", "-o": "output_dir", "-e": "output_dir",
                     "-j": "output_dir", "-r": "requeue", "-l select": "nodes", "-l nodes": "nodes",
                     "-l place": "place", "-l walltime": "walltime", "-l filesystems": "filesystems",
                     "-W depend": "dependency"}

    def restart_count(self, environ: Mapping[str, str]) -> int:
        count = environ.get(REQUEUE_COUNT, "")
        return int(count) if re.fullmatch(r"[0-9]{1,9}", count) else 0  # ASCII: "²".isdigit() is True

    def requeue_argv(self, environ: Mapping[str, str], program: Callable[[str], str]) -> list[str]:
        """Submit this job's script again with ``qsub``: PBS Pro's ``qrerun`` needs Manager or Operator privilege
        (openpbs doc/man1/qrerun.1B:84-86, enforced in src/server/req_rerun.c:241-244). The new job starts after
        this one has ended (``depend=afterany``), counts its runs in SPRITE_REQUEUE_COUNT and writes its own log
        beside the script (PBS's ``-o`` would replace this job's).

        Raises:
            UsageError: the job script did not export its own path (it was not written by sprite qsub).
        """
        script, job_id = environ.get(contract.JOB_SCRIPT, ""), environ.get("PBS_JOBID", "")
        if not script or not job_id:
            raise UsageError(f"Cannot submit this PBS job again: {contract.JOB_SCRIPT} or PBS_JOBID is not set.",
                             "Only job scripts written by sprite qsub with requeue: true export their own path.",
                             "Submit the spec with sprite qsub, with requeue: true in its scheduler block.")
        count = self.restart_count(environ) + 1
        log = Path(script).with_name(f"{Path(script).stem}-requeue{count}.log")
        return [program("qsub"), "-W", f"depend=afterany:{job_id}", "-v", f"{REQUEUE_COUNT}={count}",
                "-o", str(log), "-j", "oe", script]

    def allocation(self, environ: Mapping[str, str], read: Callable[[str], str], hostname: str) -> Allocation:
        """The hosts of PBS_NODEFILE (one line per rank slot, so hosts repeat). Raises UsageError if unusable."""
        job_id = check_job_id(self.job_variable, environ[self.job_variable])
        path = environ.get("PBS_NODEFILE", "")
        where = f"PBS_NODEFILE={one_line(path, 200)}"
        try:
            hosts = check_hosts(read(path).splitlines(), where) if path else ()
        except OSError as err:
            raise UsageError(
                f"{where} cannot be read ({err.strerror}).",
                "The job's node file is only present on the job's own nodes.",
                "Run sprite inside the PBS job (qsub -I or a job script).",
            ) from None
        except UsageError as err:
            if err.what.startswith(where):
                raise
            raise UsageError(f"{where} {err.what}", err.cause, err.fix) from None
        if not hosts:
            raise UsageError(
                f"PBS_JOBID={job_id} is set but PBS_NODEFILE names no hosts.",
                "The variable was copied into a shell outside the job, or the node file is empty.",
                "Run sprite inside the PBS job, or unset PBS_JOBID to launch on this machine only.",
            )
        return Allocation(self.name, job_id, hosts, None, path)

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
        lines = [f"#PBS {flag} {sv.directive_word(flag, value)}" for flag, value in opts if value is not None]
        return lines + [f"#PBS {sv.directive_words(item)}" for item in block.extra]

    def log_path(self, block) -> str:
        return f"{block.output_dir}/{block.stem}.log"

    def pass_env_directives(self, names: tuple[str, ...]) -> list[str]:
        # "-v NAME": NAME and its value in qsub's environment are added to the job's Variable_List (qsub(1B) of
        # PBS Professional, openpbs doc/man1/qsub.1B); by default PBS exports only the PBS_O_* variables.
        return [f"#PBS -v {sv.directive_word('v', ','.join(names))}"] if names else []

    def launch_lines(self, block, command: str) -> list[str]:
        if not block.preempt_signal:
            return super().launch_lines(block, command)
        # PBS Pro has no directive for an early warning signal, so the script sends it itself `delay` seconds
        # into the job; the timer's output goes to /dev/null so it never holds the job's output open.
        signal, before = block.preempt_signal
        delay = max(1, sv.seconds(block.walltime) - before)
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

    def status_record(self, job_id, run, program) -> dict:
        """The job's record from ``QSTAT_JSON``."""
        text = run([program("qstat"), *QSTAT_JSON.split()[1:], job_id], f"{QSTAT_JSON} {job_id}").stdout
        try:
            record = parse_qstat_json(text, job_id)
        except ValueError:
            raise UsageError(f"{QSTAT_JSON} {job_id} printed no PBS Pro JSON.",
                             "This qstat is not PBS Pro's (Slurm's and Torque's PBS-style qstat have no -F json).",
                             "Run it on a PBS Pro login node, or leave out --json.") from None
        if record is None:
            raise UsageError(f"qstat knows no job {job_id}.", "The id is mistyped or the job left the history.",
                             "Pass the id that sprite qsub printed.")
        return record

    def cancel_argv(self, job_id, program) -> list[str]:
        return [program("qdel"), job_id]
