"""Slurm (NERSC Perlmutter and most GPU clusters): SLURM_JOB_NODELIST, #SBATCH directives, sbatch / squeue /
scontrol / scancel, and srun as its own launcher."""

from __future__ import annotations

import re
from typing import Callable, Mapping

import hostlist

from sprite.values import scheduler as sv
from sprite.values import grammar as values
from sprite.schedulers.allocation import Allocation, check_hosts, check_job_id, expand_hosts
from sprite.errors import UsageError, show
from sprite.schedulers.base import Scheduler, loads


def expand_nodelist(text: str) -> tuple[str, ...]:
    """Expand a Slurm node list (``nid[001-003,007],gpu-[1-2]``). Raises UsageError when it cannot be parsed."""
    try:
        return check_hosts(expand_hosts(text), "SLURM_JOB_NODELIST", "host")
    except hostlist.BadHostlist as err:
        raise UsageError(
            f"SLURM_JOB_NODELIST={show(text)} cannot be read as a Slurm node list ({err}).",
            "SLURM_JOB_NODELIST was edited or truncated by hand.",
            "Run inside an unmodified Slurm allocation, or unset SLURM_JOB_ID to launch on this machine only.",
        ) from None


def _exit_code(value) -> int | None:
    """The job's exit code from Slurm's JSON: a raw wait status (22.05) or {"return_code": {"number": N}} (23.02+).
    Anything else (another shape, a bool, a number beyond any exit status) is None."""
    if isinstance(value, dict):
        code = value.get("return_code")
        if isinstance(code, dict):
            code = code.get("number") if code.get("set", True) is not False else None
        return code if type(code) is int and 0 <= code <= 0xFFFF else None
    return value >> 8 if type(value) is int and 0 <= value <= 0xFFFF else None


def _state(value) -> str:
    if isinstance(value, list):
        return ",".join(item for item in value if isinstance(item, str))
    return value if isinstance(value, str) else ""


def _text(value) -> str | None:
    """A text field of Slurm's JSON; another type (a number, a list, null) or "" is absent."""
    return value if isinstance(value, str) and value else None


def parse_job_json(text: str, job_id: str, source: str) -> dict | None:
    """The normalised record of ``job_id`` in ``squeue --json`` / ``scontrol --json show job`` output (None if
    absent). Slurm 22.05 lists every job whatever -j says, so the record is picked by id here; entries that are
    no mapping are skipped, fields of another type than Slurm writes are read as absent.

    Raises ValueError when ``text`` is not Slurm's JSON (a mapping with a 'jobs' list).
    """
    data = loads(text)
    jobs = data.get("jobs") if isinstance(data, dict) else None
    if not isinstance(jobs, list):
        raise ValueError("no 'jobs' list")
    for job in jobs:
        if isinstance(job, dict) and str(job.get("job_id")) == job_id:
            return {"scheduler": "slurm", "job_id": job_id, "name": _text(job.get("name")),
                    "state": _state(job.get("job_state")), "reason": _text(job.get("state_reason")),
                    "exit_code": _exit_code(job.get("exit_code")), "nodes": _text(job.get("nodes")),
                    "log": _text(job.get("standard_output")), "source": source}
    return None


def parse_scontrol_text(text: str, job_id: str) -> dict:
    """The normalised record from ``scontrol -o show job`` (Slurm before 23.02 has no ``scontrol --json``)."""
    fields = dict(part.split("=", 1) for part in text.split() if "=" in part)
    code = fields.get("ExitCode", "").split(":")[0]
    return {"scheduler": "slurm", "job_id": job_id, "name": fields.get("JobName"), "state": fields.get("JobState", ""),
            "reason": fields.get("Reason"),
            "exit_code": int(code) if re.fullmatch(r"[0-9]{1,5}", code) else None,  # ASCII: "²".isdigit()
            "nodes": fields.get("NodeList") if fields.get("NodeList") not in (None, "(null)") else None,
            "log": fields.get("StdOut"), "source": "scontrol -o show job"}


def _tasks_per_node(value: str | None) -> int | None:
    # Slurm writes e.g. "4" or "4(x2)" or "4,2(x3)": the fewest tasks any node got, so that every node holds the
    # ranks planned for it. Anything else (set by hand, "²") is no count: ranks per node then come from --devices or
    # the site.
    counts = [part.split("(")[0] for part in (value or "").split(",")]
    if not all(re.fullmatch(r"[1-9][0-9]{0,3}", count) for count in counts):
        return None
    fewest = min(int(count) for count in counts)
    return fewest if fewest <= values.MAX_RANKS_PER_NODE else None


def granted_tasks(environ: Mapping[str, str]) -> int | None:
    """Tasks per node the job asked for: SLURM_NTASKS_PER_NODE (--ntasks-per-node), else SLURM_TASKS_PER_NODE when
    the job asked for a task count (SLURM_NTASKS: -n). Without either, Slurm fills SLURM_TASKS_PER_NODE from the
    CPUs it allocated (128 a Perlmutter GPU node, whole): no number of ranks."""
    if environ.get("SLURM_NTASKS_PER_NODE"):
        return _tasks_per_node(environ["SLURM_NTASKS_PER_NODE"])
    if environ.get("SLURM_NTASKS") or environ.get("SLURM_NPROCS"):
        return _tasks_per_node(environ.get("SLURM_TASKS_PER_NODE"))
    return None


class Slurm(Scheduler):
    name = "slurm"
    job_variable = "SLURM_JOB_ID"
    label = "Slurm"
    example_spec = "perlmutter.job.yaml"
    submit_program = "sbatch"
    status_program = "squeue"
    script_suffix = ".sbatch"
    auto_launcher = "srun"
    own_launchers = ("srun",)
    block_checks = {"partition": sv.name, "constraint": sv.token, "gpus_per_node": values.per_node,
                    "cpus_per_task": values.per_node}
    client_hint = "Slurm's client commands exist on the login nodes of Slurm sites (Perlmutter)"
    max_signal_lead = 65535  # sbatch --signal=SIG@TIME takes at most 0xffff seconds
    owned_options = {**dict.fromkeys(("--job-name", "-J"), "job_name"), **dict.fromkeys(("--account", "-A"), "account"),
                     **dict.fromkeys(("--qos", "-q"), "queue"), **dict.fromkeys(("--partition", "-p"), "partition"),
                     **dict.fromkeys(("--constraint", "-C"), "constraint"), **dict.fromkeys(("--nodes", "-N"), "nodes"),
                     **dict.fromkeys(("--ntasks-per-node", "--ntasks", "-n"), "devices"),
                     "--gpus-per-node": "gpus_per_node", **dict.fromkeys(("--cpus-per-task", "-c"), "cpus_per_task"),
                     **dict.fromkeys(("--time", "-t"), "walltime"),
                     **dict.fromkeys(("--output", "-o", "--error", "-e"), "output_dir"),
                     **dict.fromkeys(("--dependency", "-d"), "dependency"), "--signal": "preempt_signal",
                     **dict.fromkeys(("--requeue", "--no-requeue"), "requeue")}
    requeue_options = {"--open-mode": "--open-mode=append keeps the first run's log when the job runs again"}

    def restart_count(self, environ: Mapping[str, str]) -> int:
        # 1 in the first rerun of a requeued job (seen here: `scontrol requeue` with the FACTS.md slurm.conf)
        count = environ.get("SLURM_RESTART_COUNT", "")
        return int(count) if re.fullmatch(r"[0-9]{1,9}", count) else 0  # ASCII: "²".isdigit() is True

    def requeue_argv(self, environ: Mapping[str, str], program: Callable[[str], str]) -> list[str]:
        """``scontrol requeue JOBID`` (an array task as ``ARRAYID_TASKID``, as Lightning's SLURMEnvironment does,
        trainer/connectors/signal_connector.py:82-90); it needs ``#SBATCH --requeue``. Slurm then ends this batch
        script and holds the job for ``cred_expire`` (120 s by default) before it starts again."""
        array, task = environ.get("SLURM_ARRAY_JOB_ID", ""), environ.get("SLURM_ARRAY_TASK_ID", "")
        job_id = f"{array}_{task}" if array and task else environ.get("SLURM_JOB_ID", "")
        if not job_id:
            return super().requeue_argv(environ, program)
        return [program("scontrol"), "requeue", job_id]

    def allocation(self, environ: Mapping[str, str], read: Callable[[str], str], hostname: str) -> Allocation:
        """The hosts of SLURM_JOB_NODELIST. Raises UsageError when the node list is missing or unreadable."""
        job_id = check_job_id(self.job_variable, environ[self.job_variable])
        text = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST", "")
        if not text:
            raise UsageError(
                f"SLURM_JOB_ID={job_id} is set but SLURM_JOB_NODELIST is empty.",
                "The variable was copied into a shell outside the job.",
                "Run sprite inside the allocation (salloc or an sbatch script), or unset SLURM_JOB_ID.",
            )
        tasks = granted_tasks(environ)
        return Allocation(self.name, job_id, expand_nodelist(text), tasks)

    def requested_allocation(self, hosts: tuple[str, ...], ranks_per_node: int) -> Allocation:
        # The job script asks for --ntasks-per-node=<ranks per node>, so SLURM_NTASKS_PER_NODE will say so.
        return Allocation(self.name, "planned", hosts, ranks_per_node, None, planned=True)

    def directives(self, block, devices: int) -> list[str]:
        """sbatch directives; ``queue`` is the QOS (``-q``), as on Perlmutter (``-q regular|debug``)."""
        opts = [("job-name", block.job_name), ("account", block.account), ("qos", block.queue),
                ("partition", block.partition), ("constraint", block.constraint), ("nodes", block.nodes),
                ("ntasks-per-node", devices), ("gpus-per-node", block.gpus_per_node),
                ("cpus-per-task", block.cpus_per_task), ("time", block.walltime), ("output", self.log_path(block))]
        if block.dependency:
            opts.append(("dependency", "afterok:" + ":".join(block.dependency)))
        if block.preempt_signal:
            # B: to the batch shell, which is `sprite run` (the script execs it): it passes the signal to the
            # launcher (srun forwards it to every task, srun(1) SIGNALS), so the ranks get it under any launcher.
            opts.append(("signal", "B:{}@{}".format(*block.preempt_signal)))
        if block.requeue:
            opts.append(("open-mode", "append"))  # a requeued job writes the same log file: keep the first run's
        lines = [f"#SBATCH --{flag}={sv.directive_word(flag, value)}" for flag, value in opts if value is not None]
        if block.requeue is not None:
            lines.append("#SBATCH --requeue" if block.requeue else "#SBATCH --no-requeue")
        return lines + [f"#SBATCH {sv.directive_words(item)}" for item in block.extra]

    def log_path(self, block) -> str:
        return f"{block.output_dir}/{block.stem}-%j.log"

    def pass_env_directives(self, names: tuple[str, ...]) -> list[str]:
        # "--export=ALL,NAME": all of the submitting environment plus NAME with its current value there; names
        # only, a value would be written into the script (sbatch(1) of Slurm 22.05, "--export"). ALL keeps the
        # default propagation the rest of the job relies on (PATH, the venv).
        if not names:
            return []
        return [f"#SBATCH --export={sv.directive_word('export', 'ALL,' + ','.join(names))}"]

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

    def status_record(self, job_id, run, program) -> dict:
        """squeue's JSON while Slurm knows the job, else scontrol's (JSON from 23.02, text before)."""
        for argv, source in (([program("squeue"), "--json", "-j", job_id], "squeue --json"),
                             ([program("scontrol"), "--json", "show", "job", job_id], "scontrol --json show job")):
            done = run(argv, None)
            try:
                record = parse_job_json(done.stdout, job_id, source) if done.returncode == 0 else None
            except ValueError:  # no JSON serializer plugin, or an older client: ask the next one
                record = None
            if record:
                return record
        text = run([program("scontrol"), "-o", "show", "job", job_id], f"scontrol show job {job_id}").stdout
        return parse_scontrol_text(text, job_id)

    def cancel_argv(self, job_id, program) -> list[str]:
        return [program("scancel"), job_id]

    def per_node_agents(self, nodes: int, hosts: tuple[str, ...], argv: list[str]) -> list[str]:
        return ["srun", "--nodes", str(nodes), "--ntasks", str(nodes), "--ntasks-per-node", "1",
                "--nodelist", ",".join(hosts), "--kill-on-bad-exit=1", "--export=ALL", *argv]
