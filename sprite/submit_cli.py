"""Typer commands ``sprite qsub``, ``sprite sbatch``, ``sprite status`` and ``sprite cancel``; mounted by register()."""

from __future__ import annotations

from typing import Optional

import typer

from sprite.errors import UsageError

SUBMIT_HELP = """Write a {kind} job script for SPEC and submit it with {cmd}; print the job id and the log path.

SPEC is a job spec YAML (or the name of a shipped example such as {example}); its scheduler: block
gives account, queue, walltime and the rest, over the site profile's defaults. The script runs
`sprite run` with the spec, so the launch inside the job is the plan of sprite run.

\b
Examples:
  sprite {cmd} --dry-run {example}      # print the script, submit nothing
  sprite {cmd} my.job.yaml
"""


def _job_id(value: str) -> str:
    from sprite import submit_values

    if not submit_values.NAME.fullmatch(value):
        raise UsageError(f"{value!r} is not a job id.", "Job ids are numbers or names such as 123.server.",
                         "Pass the id that sprite qsub/sbatch printed.")
    return value


def _submit(spec_name: str, kind: str, dry_run: bool) -> None:
    from sprite import submit

    prepared = submit.prepare(spec_name, kind)
    if dry_run:
        typer.echo(prepared.text, nl=False)
        return
    job_id = submit.submit(prepared)
    typer.echo(f"submitted {kind} job {job_id}")
    typer.echo(f"script  {prepared.script_path}")
    typer.echo(f"log     {prepared.log_path.replace('%j', job_id)}")


def register(app: typer.Typer) -> None:
    """Add the scheduler commands to ``app`` (imports nothing heavy; no torch or lightning)."""

    @app.command("qsub", help=SUBMIT_HELP.format(kind="PBS", cmd="qsub", example="aurora.job.yaml"))
    def qsub(spec: str = typer.Argument(..., help="job spec YAML or a shipped example name"),
             dry_run: bool = typer.Option(False, "--dry-run", help="print the job script instead of submitting")):
        _submit(spec, "pbs", dry_run)

    @app.command("sbatch", help=SUBMIT_HELP.format(kind="Slurm", cmd="sbatch", example="perlmutter.job.yaml"))
    def sbatch(spec: str = typer.Argument(..., help="job spec YAML or a shipped example name"),
               dry_run: bool = typer.Option(False, "--dry-run", help="print the job script instead of submitting")):
        _submit(spec, "slurm", dry_run)

    scheduler_opt = typer.Option(None, "--scheduler", help="pbs|slurm; default: the site's, else the client on PATH")
    site_opt = typer.Option(None, "--site", help="site profile whose scheduler to ask")
    job_id_arg = typer.Argument(..., help="the job id sprite qsub/sbatch printed")

    @app.command("status", help="Show a job's state (qstat / squeue, or scontrol once it left the queue).\n\n"
                                "Example: sprite status 1234")
    def status(job_id: str = job_id_arg, scheduler: Optional[str] = scheduler_opt,
               site: Optional[str] = site_opt):
        from sprite import submit

        typer.echo(submit.status(_job_id(job_id), submit.pick(_kind(scheduler), site)))

    @app.command("cancel", help="Cancel a job (qdel / scancel).\n\nExample: sprite cancel 1234")
    def cancel(job_id: str = job_id_arg, scheduler: Optional[str] = scheduler_opt,
               site: Optional[str] = site_opt):
        from sprite import submit

        submit.cancel(_job_id(job_id), submit.pick(_kind(scheduler), site))
        typer.echo(f"cancel requested for job {job_id}")


def _kind(value: Optional[str]) -> Optional[str]:
    if value is not None and value not in ("pbs", "slurm"):
        raise UsageError(f"Option --scheduler {value!r} is not a scheduler.", "", "Allowed: pbs, slurm.")
    return value
