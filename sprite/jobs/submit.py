"""sprite qsub / sbatch / status / cancel: turn a spec into a job script, hand it to the scheduler, ask about it.

A submission is planned in full before anything is written: the spec and the site are checked, and the launch
that ``sprite run`` will make inside the job is planned for the requested allocation (nodes and ranks per node of
the scheduler block, the exclude list, the strategy), so a job that cannot launch is refused here, not after
waiting in the queue. The only effects are ``sprite.jobs.files`` (a new script name per submission, the script
0600 and its folder 0700 when sprite creates it) and ``sprite.jobs.clients`` (the scheduler's commands, with a
deadline; ``sprite status`` and ``sprite cancel`` live there). The script holds no secret's value: the submit command gets those through its environment and runs
with umask 077, the default job umask of PBS Pro, so the job's log is owner-only too.
"""

from __future__ import annotations

import os
import shlex
import sys
from dataclasses import dataclass, field, replace
from importlib import resources

from sprite import schedulers
from sprite.schedulers import allocation
from sprite.jobs import clients
from sprite.jobs import files as jobfiles
from sprite.jobs import script as jobscript
from sprite.launch import plan
from sprite.spec import scheduler_block
from sprite.spec import secrets as secret_env
from sprite.spec import job as spec
from sprite.spec import yamldoc
from sprite.errors import UsageError, show
from sprite.spec.scheduler_block import SchedulerBlock
from sprite.schedulers.base import Scheduler


@dataclass(frozen=True)
class Prepared:
    """A rendered job script and where it and its log go. ``kind`` names its batch system.

    ``pass_env`` names the variables the job takes from the submitting environment; ``literals`` holds the
    values of secrets the spec wrote itself (allowed by --allow-literal-secrets), given to the submit command
    through its environment and never printed.
    """

    kind: str
    text: str
    script_path: str
    log_path: str
    launch: tuple[str, ...] = ()  # the launch `sprite run` plans inside the job (placeholder hosts and job id)
    warnings: tuple[str, ...] = ()  # what the site would object to without refusing the job
    block: SchedulerBlock | None = None
    body: tuple = ()  # (run argv, ranks per node, spec path, working folder, export lines): for render
    pass_env: tuple = ()
    secrets: tuple = ()
    literals: dict = field(default_factory=dict, repr=False)

    def restem(self, stem: str) -> "Prepared":
        """The same job under the file name stem ``stem`` (its script and log paths change, nothing else)."""
        again = _render(self.kind, replace(self.block, stem=stem), *self.body)
        return replace(again, launch=self.launch, warnings=self.warnings, pass_env=self.pass_env,
                       secrets=self.secrets, literals=self.literals)

    def dry_run_text(self) -> str:
        """The script, then the launch line inside the job as shell comments (so it stays a valid script)."""
        return (self.text + "# sprite --dry-run: inside the job, `sprite run` will start (hosts and job id as the "
                "scheduler grants them):\n# " + shlex.join(self.launch) + "\n")


def locate_spec(name: str) -> str:
    """``name`` if it is a file, else a shipped example spec of that name. Raises UsageError if neither."""
    if os.path.exists(name):
        return name
    for candidate in (name, f"{name}.job.yaml"):
        shipped = resources.files("sprite.conf") / candidate if _shippable(candidate) else None
        if shipped is not None and shipped.is_file():
            return str(shipped)
    shipped = sorted(p.name for p in resources.files("sprite.conf").iterdir() if p.name.endswith(".job.yaml"))
    raise UsageError(f"The job spec {show(name)} does not exist.", "The path is misspelled or relative to another "
                     "folder.", f"Pass a spec YAML file, or one of the shipped examples: {', '.join(shipped)}.")


def _shippable(name: str) -> bool:
    """True when ``name`` could be a shipped file's name (no folder, not overlong)."""
    return "/" not in name and 0 < len(name) <= 100


def _script_path(block: SchedulerBlock, scheduler: Scheduler) -> str:
    return os.path.join(block.output_dir, block.stem + scheduler.script_suffix)


def _render(kind: str, block: SchedulerBlock, argv, devices, spec_path, cwd, exports) -> Prepared:
    scheduler = schedulers.get(kind)
    script = _script_path(block, scheduler)
    text = jobscript.render(block, argv, devices, spec_path, cwd, exports, script)
    return Prepared(kind, text, script, scheduler.log_path(block), block=block,
                    body=(argv, devices, spec_path, cwd, exports))


def _plan_launch(job, site, scheduler: Scheduler, block: SchedulerBlock, devices: int, python: str) -> list[str]:
    """Plan the job's launch in the allocation its script requests; return its argv (placeholder hosts, for
    --dry-run). Raises UsageError when it cannot launch."""
    excluded = allocation.unique(host for item in job.exclude for host in allocation.expand_hosts(item))
    hosts = (*excluded, *(f"planned-node-{n}" for n in range(1, block.nodes + 1)))[:block.nodes]
    return plan.plan_in(job, site, scheduler.requested_allocation(hosts, devices), python).argv


def prepare(spec_name: str, kind: str, cwd: str | None = None, allow_literal_secrets: bool = False) -> Prepared:
    """Validate the spec for the batch system ``kind``, plan its launch and render its script (for the first
    free file name). Writes nothing.

    Raises UsageError / SpecError (a secret with a literal value unless ``allow_literal_secrets``).
    """
    cwd = cwd or os.getcwd()
    scheduler = schedulers.get(kind)
    spec_file = locate_spec(spec_name)
    doc = yamldoc.load(spec_file)
    # the submitting shell's variables stay out of the spec, but not the site it names (docs/sites.md's order)
    chosen = {name: os.environ[name] for name in ("SPRITE_SITE",) if name in os.environ}
    job, site = plan.assemble({}, spec_file, environ=chosen, allow_literal_secrets=allow_literal_secrets)
    site_scheduler = schedulers.get(site.scheduler)
    if site_scheduler.submit_program and site_scheduler is not scheduler:
        raise UsageError(f"The site {site.name} schedules jobs with {site.scheduler.upper()}, not {kind.upper()}.",
                         f"sprite {scheduler.submit_program} was used with a spec for {site.name}.",
                         f"Use sprite {site_scheduler.submit_program} {show(spec_name)}, or set site: to a "
                         f"{kind.upper()} site.")
    file_layer = spec.from_document(doc)
    secret = secret_env.names(job, site)
    literals = {name: value for name, value in file_layer.get("env", {}).items() if name in secret}
    passed = tuple(dict.fromkeys((*literals, *job.pass_env, *job.secrets)))
    block = replace(scheduler_block.resolve(kind, doc, site, job, cwd), pass_env=passed)
    for where in ("setup", "extra"):
        secret_env.check_written(getattr(block, where), job, site, where)
    jobfiles.check_output_folder(block.output_dir)  # as submit() will: the dry run refuses what the submit would
    spec.check_allowances(job)  # as the job's sprite run will, after waiting in the queue
    if job.log_dir:  # as the job's sprite run will, after waiting in the queue
        from sprite.launch import ranklog

        ranklog.check(job.log_dir, job.blame("log_dir"))
    warning = scheduler_block.check_account(block, site, doc)
    python = block.python or sys.executable
    devices = jobscript.ranks_per_node(job, site)
    launch = _plan_launch(job, site, scheduler, block, devices, python)
    argv = jobscript.run_argv(python, site, file_layer, job, block, allow_literal_secrets)
    body = (argv, devices, spec.absolute(spec_file), cwd, jobscript.exports(file_layer, secret))
    stem = jobfiles.free_stem(block.job_name, lambda s: _paths(replace(block, stem=s), scheduler))
    prepared = _render(kind, replace(block, stem=stem), *body)
    return replace(prepared, launch=tuple(launch), warnings=(warning,) if warning else (), pass_env=passed,
                   secrets=job.secrets, literals=literals)


def _paths(block: SchedulerBlock, scheduler: Scheduler) -> tuple[str, str]:
    return _script_path(block, scheduler), scheduler.log_path(block)


def submit(prepared: Prepared) -> tuple[str, Prepared]:
    """Write the script under a new name and submit it; return the job id and what was submitted.

    A refused submission removes the script and the folders it created, so the user's files are as they were.
    Raises UsageError (missing command, a variable to pass that this environment does not set, unusable output
    folder, refused job), ClientTimeout and ClientInterrupted (Ctrl-C while the client ran): both keep the script,
    since the job may exist and its requeue submits that script again.
    """
    scheduler = schedulers.get(prepared.kind)
    command = clients.program(scheduler.submit_program, scheduler)
    secret_env.missing([n for n in prepared.pass_env if n not in prepared.literals], os.environ, prepared.secrets)
    written = jobfiles.Written()
    jobfiles.output_folder(prepared.block.output_dir, written)
    asked = False  # whether the submit command was started: from then on the job may exist
    try:
        while not jobfiles.write_script(prepared.script_path, prepared.text, written):
            block = prepared.block
            prepared = prepared.restem(jobfiles.free_stem(block.job_name, lambda s: _paths(replace(block, stem=s),
                                                                                             scheduler)))
        argv = scheduler.submit_argv(command, prepared.script_path, prepared.log_path)
        env = {**os.environ, **prepared.literals}  # with umask 077 (clients.call): the job's log is owner-only
        asked = True
        done = clients.run(argv, f"{scheduler.submit_program} {prepared.script_path}", env)
    except clients.ClientTimeout as err:
        raise clients.ClientTimeout(f"{err.what} The job may have been submitted all the same: check the queue "
                                    f"before submitting again (the script stays at {prepared.script_path}).",
                                    err.cause, err.fix) from None
    except KeyboardInterrupt:
        if not asked:
            written.undo()
            raise
        raise clients.ClientInterrupted(
            f"Interrupted while {scheduler.submit_program} ran: the job may have been submitted all the same.",
            "The scheduler may have taken it before the interrupt reached its client.",
            f"Check the queue before submitting again; the script stays at {prepared.script_path}.") from None
    except BaseException:
        written.undo()
        raise
    job_id = scheduler.parse_job_id(done.stdout)
    if not allocation.JOB_ID.fullmatch(job_id):
        raise UsageError(f"{argv[0]} printed no job id (its output: {show(done.stdout[-200:])}).",
                         "The scheduler accepted nothing, or printed something sprite cannot read.",
                         f"Check its queue; the script stays at {prepared.script_path}.")
    return job_id, prepared
