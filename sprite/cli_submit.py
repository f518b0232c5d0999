"""Typer commands that submit and follow jobs: one submit command per batch system (``sprite qsub``,
``sprite sbatch``, named after the system's own client), ``sprite status`` and ``sprite cancel``."""

from __future__ import annotations

from typing import Optional

import typer

from sprite import schedulers
from sprite.errors import UsageError, show
from sprite.schedulers.base import Scheduler

SUBMIT_HELP = """Write a {kind} job script for SPEC and submit it with {cmd}; print the job id and the log path.

SPEC is a job spec YAML (or the name of a shipped example such as {example}); its scheduler: block
gives account, queue, walltime and the rest, over the site profile's defaults. The script runs
`sprite run` with the spec, so the launch inside the job is the plan of sprite run. Secrets
(secrets: names, or names such as *_TOKEN) are taken from this shell's environment at submission
and never written; the script is created readable by you only.

\b
Examples:
  sprite {cmd} --dry-run {example}      # print the script, submit nothing
  sprite {cmd} my.job.yaml
"""


def _job_id(value: str) -> str:
    from sprite import allocation

    if not allocation.JOB_ID.fullmatch(value):
        raise UsageError(f"{show(value)} is not a job id.", "Job ids are numbers or names such as 123.server.",
                         "Pass the id that sprite qsub/sbatch printed.")
    return value


def _submit(spec_name: str, scheduler: Scheduler, dry_run: bool, allow_literal_secrets: bool = False) -> None:
    from sprite import submit

    prepared = submit.prepare(spec_name, scheduler.name, allow_literal_secrets=allow_literal_secrets)
    if dry_run:
        typer.echo(prepared.text, nl=False)
        return
    job_id, prepared = submit.submit(prepared)
    typer.echo(f"submitted {scheduler.name} job {job_id}")
    typer.echo(f"script  {prepared.script_path}")
    typer.echo(f"log     {prepared.log_path.replace('%j', job_id)}")


def _register_submit(app: typer.Typer, scheduler: Scheduler) -> None:
    help_text = SUBMIT_HELP.format(kind=scheduler.label, cmd=scheduler.submit_program, example=scheduler.example_spec)

    @app.command(scheduler.submit_program, help=help_text)
    def submit_command(spec: str = typer.Argument(..., help="job spec YAML or a shipped example name"),
                       dry_run: bool = typer.Option(False, "--dry-run",
                                                    help="print the job script instead of submitting"),
                       allow_literal_secrets: bool = typer.Option(
                           False, "--allow-literal-secrets",
                           help="accept a literal value for a secret in the spec (passed through the submit "
                                "command's environment, never written into the script)")):
        _submit(spec, scheduler, dry_run, allow_literal_secrets)


def register(app: typer.Typer) -> None:
    """Add the scheduler commands to ``app`` (imports nothing heavy; no torch or lightning)."""
    for scheduler in schedulers.batch():
        _register_submit(app, scheduler)

    names = "|".join(s.name for s in schedulers.batch())
    scheduler_opt = typer.Option(None, "--scheduler", help=f"{names}; default: the site's, else the client on PATH")
    site_opt = typer.Option(None, "--site", help="site profile whose scheduler to ask")
    job_id_arg = typer.Argument(..., help="the job id sprite qsub/sbatch printed")

    @app.command("status", help="Show a job's state (qstat / squeue, or scontrol once it left the queue).\n\n"
                                "Example: sprite status 1234")
    def status(job_id: str = job_id_arg, scheduler: Optional[str] = scheduler_opt,
               site: Optional[str] = site_opt):
        from sprite import clients

        typer.echo(clients.status(_job_id(job_id), clients.pick(_kind(scheduler), site)))

    @app.command("cancel", help="Cancel a job (qdel / scancel).\n\nExample: sprite cancel 1234")
    def cancel(job_id: str = job_id_arg, scheduler: Optional[str] = scheduler_opt,
               site: Optional[str] = site_opt):
        from sprite import clients

        clients.cancel(_job_id(job_id), clients.pick(_kind(scheduler), site))
        typer.echo(f"cancel requested for job {job_id}")


def _kind(value: Optional[str]) -> Optional[str]:
    allowed = [s.name for s in schedulers.batch()]
    if value is not None and value not in allowed:
        raise UsageError(f"Option --scheduler {show(value)} is not a scheduler.", "", f"Allowed: {', '.join(allowed)}.")
    return value
