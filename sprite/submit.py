"""sprite qsub / sbatch / status / cancel: turn a spec into a job script, hand it to the scheduler, ask about it.

The only effects are here: writing the script into the output directory and running qsub, sbatch, qstat,
squeue, scontrol, qdel or scancel as argument lists (never through a shell).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from sprite import jobscript, launch, scheduler_spec, sites, spec, submit_command, submit_directives, yamlsrc
from sprite.errors import UsageError

SUBMIT = {"pbs": "qsub", "slurm": "sbatch"}
CANCEL = {"pbs": ["qdel"], "slurm": ["scancel"]}
SUFFIX = {"pbs": ".pbs", "slurm": ".sbatch"}
CLIENT_HINT = {"pbs": "PBS Pro's client commands exist on the login nodes of PBS sites (Aurora, Polaris)",
               "slurm": "Slurm's client commands exist on the login nodes of Slurm sites (Perlmutter)"}


@dataclass(frozen=True)
class Prepared:
    """A rendered job script and where it and its log go."""

    kind: str
    text: str
    script_path: str
    log_path: str


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


def prepare(spec_name: str, kind: str, cwd: str | None = None) -> Prepared:
    """Validate the spec for ``kind`` ("pbs"/"slurm") and render its script. Raises UsageError / SpecError."""
    cwd = cwd or os.getcwd()
    spec_file = locate_spec(spec_name)
    doc = yamlsrc.load(spec_file)
    job, site = launch.assemble({}, spec_file, environ={})
    if site.scheduler in SUBMIT and site.scheduler != kind:
        raise UsageError(f"The site {site.name} schedules jobs with {site.scheduler.upper()}, not {kind.upper()}.",
                         f"sprite {SUBMIT[kind]} was used with a spec for {site.name}.",
                         f"Use sprite {SUBMIT[site.scheduler]} {spec_name}, or set site: to a {kind.upper()} site.")
    block = scheduler_spec.resolve(kind, doc, site, job, cwd)
    argv = submit_command.run_argv(block.python or sys.executable, site, spec.from_document(doc), job)
    devices = submit_command.ranks_per_node(job, site)
    text = jobscript.render(block, argv, devices, str(Path(spec_file).resolve()), cwd)
    script = os.path.join(block.output_dir, block.job_name + SUFFIX[kind])
    return Prepared(kind, text, script, submit_directives.log_path(block))


def program(name: str, kind: str) -> str:
    """The full path of the scheduler command ``name``. Raises UsageError when it is not on PATH."""
    found = shutil.which(name)
    if not found:
        raise UsageError(f"The {kind.upper()} command '{name}' is not on PATH.",
                         f"{CLIENT_HINT[kind]}; this machine has none.",
                         "Run this on the site's login node, or use --dry-run to print the job script.")
    return found


def _run(argv: list[str], what: str) -> subprocess.CompletedProcess:
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        detail = (done.stderr or done.stdout).strip().splitlines()
        raise UsageError(f"{what} failed (exit {done.returncode}): {detail[-1] if detail else 'no output'}.",
                         "The scheduler refused the request or is not reachable from here.",
                         "Fix what its message names (the spec or the job id), or run this on the site's login node.")
    return done


def submit(prepared: Prepared) -> str:
    """Write the script and submit it; return the job id. Raises UsageError (missing command, refused job)."""
    command = program(SUBMIT[prepared.kind], prepared.kind)
    os.makedirs(os.path.dirname(prepared.script_path), exist_ok=True)
    Path(prepared.script_path).write_text(prepared.text)
    os.chmod(prepared.script_path, 0o755)
    if prepared.kind == "slurm":
        argv = [command, "--parsable", prepared.script_path]
    else:  # -o/-j repeat the directives: Slurm's PBS-compatible qsub reads options only from its command line
        argv = [command, "-o", prepared.log_path, "-j", "oe", prepared.script_path]
    out = _run(argv, f"{SUBMIT[prepared.kind]} {prepared.script_path}").stdout.strip().splitlines()
    job_id = out[-1].split()[-1].split(";")[0] if out else ""
    if not job_id:
        raise UsageError(f"{argv[0]} printed no job id.", "The scheduler accepted nothing.", "Check its queue.")
    return job_id


def pick(scheduler: str | None, site_name: str | None) -> str:
    """"pbs" or "slurm": the flag, else the site's scheduler, else whichever client is on PATH."""
    if scheduler:
        return scheduler
    site_scheduler = sites.load(site_name).scheduler if site_name else None
    if site_scheduler in SUBMIT:
        return site_scheduler
    for kind, probe in (("slurm", "squeue"), ("pbs", "qstat")):  # Slurm first: its qstat may be a PBS wrapper
        if shutil.which(probe):
            return kind
    raise UsageError("Neither squeue (Slurm) nor qstat (PBS) is on PATH.", "This machine has no scheduler client.",
                     "Run this on a login node of the site that runs the job, or pass --scheduler.")


def status(job_id: str, kind: str) -> str:
    """The scheduler's view of ``job_id``. Raises UsageError when the command is missing or knows no such job."""
    if kind == "pbs":
        return _run([program("qstat", kind), job_id], f"qstat {job_id}").stdout.rstrip()
    rows = subprocess.run([program("squeue", kind), "-h", "-j", job_id, "-o", "%i %j %T %M %l %D %R"],
                          capture_output=True, text=True).stdout.strip()
    if rows:
        return "JOBID NAME STATE TIME TIME_LIMIT NODES NODELIST(REASON)\n" + rows
    # Finished jobs leave squeue; scontrol keeps them for MinJobAge (sacct needs accounting, often off).
    record = _run([program("scontrol", kind), "-o", "show", "job", job_id], f"scontrol show job {job_id}").stdout
    fields = dict(part.split("=", 1) for part in record.split() if "=" in part)
    return " ".join(f"{key}={fields.get(key, '?')}" for key in ("JobId", "JobName", "JobState", "ExitCode"))


def cancel(job_id: str, kind: str) -> None:
    """Cancel ``job_id``. Raises UsageError when the command is missing or refuses."""
    _run([program(CANCEL[kind][0], kind), job_id], f"{CANCEL[kind][0]} {job_id}")
