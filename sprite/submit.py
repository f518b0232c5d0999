"""sprite qsub / sbatch / status / cancel: turn a spec into a job script, hand it to the scheduler, ask about it.

The only effects are here: writing the script into the output directory and running the scheduler's client
commands (the scheduler module names them) as argument lists, never through a shell. The script is created 0600
(its folder 0700 when sprite creates it) and holds no secret's value: the submit command gets those through its
environment and runs with umask 077, the default job umask of PBS Pro, so the job's log is owner-only too.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path

from sprite import integrity, jobscript, owner_only, plan, scheduler_block, schedulers, secret_env, sites, spec, yamldoc
from sprite.errors import UsageError
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
    pass_env: tuple = ()
    secrets: tuple = ()
    literals: dict = field(default_factory=dict, repr=False)


def locate_spec(name: str) -> str:
    """``name`` if it is a file, else a shipped example spec of that name. Raises UsageError if neither."""
    if os.path.exists(name):
        return name
    for candidate in (name, f"{name}.job.yaml"):
        shipped = resources.files("sprite.conf") / candidate
        if "/" not in candidate and shipped.is_file():
            return str(shipped)
    shipped = sorted(p.name for p in resources.files("sprite.conf").iterdir() if p.name.endswith(".job.yaml"))
    raise UsageError(f"The job spec {name} does not exist.", "The path is misspelled or relative to another folder.",
                     f"Pass a spec YAML file, or one of the shipped examples: {', '.join(shipped)}.")


def prepare(spec_name: str, kind: str, cwd: str | None = None, allow_literal_secrets: bool = False) -> Prepared:
    """Validate the spec for the batch system ``kind`` and render its script.

    Raises UsageError / SpecError (a secret with a literal value unless ``allow_literal_secrets``).
    """
    cwd = cwd or os.getcwd()
    scheduler = schedulers.get(kind)
    spec_file = locate_spec(spec_name)
    doc = yamldoc.load(spec_file)
    job, site = plan.assemble({}, spec_file, environ={}, allow_literal_secrets=allow_literal_secrets)
    site_scheduler = schedulers.get(site.scheduler)
    if site_scheduler.submit_program and site_scheduler is not scheduler:
        raise UsageError(f"The site {site.name} schedules jobs with {site.scheduler.upper()}, not {kind.upper()}.",
                         f"sprite {scheduler.submit_program} was used with a spec for {site.name}.",
                         f"Use sprite {site_scheduler.submit_program} {spec_name}, or set site: to a {kind.upper()} "
                         "site.")
    file_layer = spec.from_document(doc)
    secret = secret_env.names(job, site)
    literals = {name: value for name, value in file_layer.get("env", {}).items() if name in secret}
    passed = tuple(dict.fromkeys((*literals, *job.pass_env, *job.secrets)))
    block = replace(scheduler_block.resolve(kind, doc, site, job, cwd), pass_env=passed)
    argv = jobscript.run_argv(block.python or sys.executable, site, file_layer, job)
    devices = jobscript.ranks_per_node(job, site)
    text = jobscript.render(block, argv, devices, str(Path(spec_file).resolve()), cwd,
                            jobscript.exports(file_layer, secret))
    script = os.path.join(block.output_dir, block.job_name + scheduler.script_suffix)
    return Prepared(kind, text, script, scheduler.log_path(block), passed, job.secrets, literals)


def program(name: str, scheduler: Scheduler) -> str:
    """The full path of the scheduler command ``name``. Raises UsageError when it is not on PATH."""
    found = shutil.which(name)
    if not found:
        raise UsageError(f"The {scheduler.name.upper()} command '{name}' is not on PATH.",
                         f"{scheduler.client_hint}; this machine has none.",
                         "Run this on the site's login node, or use --dry-run to print the job script.")
    return found


def _run(argv: list[str], what: str | None, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run a client command; when ``what`` is given, raise UsageError naming it if the command fails.

    ``env`` (the submit command's) also sets umask 077, so what the job's system writes for it is owner-only.
    """
    done = subprocess.run(argv, capture_output=True, text=True, env=env, umask=0o077 if env is not None else -1)
    if what is not None and done.returncode != 0:
        detail = (done.stderr or done.stdout).strip().splitlines()
        raise UsageError(f"{what} failed (exit {done.returncode}): {detail[-1] if detail else 'no output'}.",
                         "The scheduler refused the request or is not reachable from here.",
                         "Fix what its message names (the spec or the job id), or run this on the site's login node.")
    return done


def submit(prepared: Prepared) -> str:
    """Write the script (0600) and submit it; return the job id.

    Raises UsageError (missing command, a variable to pass that this environment does not set, refused job);
    IntegrityError when the script's name exists already.
    """
    scheduler = schedulers.get(prepared.kind)
    command = program(scheduler.submit_program, scheduler)
    secret_env.missing([n for n in prepared.pass_env if n not in prepared.literals], os.environ, prepared.secrets)
    owner_only.make_dirs(os.path.dirname(prepared.script_path))
    integrity.write_new(prepared.script_path, prepared.text.encode())
    argv = scheduler.submit_argv(command, prepared.script_path, prepared.log_path)
    env = {**os.environ, **prepared.literals}
    job_id = scheduler.parse_job_id(_run(argv, f"{scheduler.submit_program} {prepared.script_path}", env).stdout)
    if not job_id:
        raise UsageError(f"{argv[0]} printed no job id.", "The scheduler accepted nothing.", "Check its queue.")
    return job_id


def pick(name: str | None, site_name: str | None) -> Scheduler:
    """The batch system to ask: the flag, else the site's, else whichever client is on PATH."""
    if name:
        return schedulers.get(name)
    site_scheduler = schedulers.get(sites.load(site_name).scheduler) if site_name else None
    if site_scheduler is not None and site_scheduler.submit_program:
        return site_scheduler
    for scheduler in schedulers.by_client_probe():
        if shutil.which(scheduler.status_program):
            return scheduler
    clients = " nor ".join(f"{s.status_program} ({s.label})" for s in schedulers.by_client_probe())
    raise UsageError(f"Neither {clients} is on PATH.", "This machine has no scheduler client.",
                     "Run this on a login node of the site that runs the job, or pass --scheduler.")


def status(job_id: str, scheduler: Scheduler) -> str:
    """The scheduler's view of ``job_id``. Raises UsageError when the command is missing or knows no such job."""
    return scheduler.status(job_id, _run, lambda name: program(name, scheduler))


def cancel(job_id: str, scheduler: Scheduler) -> None:
    """Cancel ``job_id``. Raises UsageError when the command is missing or refuses."""
    argv = scheduler.cancel_argv(job_id, lambda name: program(name, scheduler))
    _run(argv, f"{Path(argv[0]).name} {job_id}")
