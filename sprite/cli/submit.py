"""Typer commands that submit and follow jobs: one submit command per batch system (``sprite qsub``,
``sprite sbatch``, named after the system's own client), ``sprite status`` and ``sprite cancel``."""

from __future__ import annotations

import enum
import json
import sys
from typing import Optional

import typer

from sprite import schedulers
from sprite.errors import UsageError, show
from sprite.schedulers.base import Scheduler

# The batch systems' names as a fixed choice (--help lists them; typer refuses others in one line).
Kind = enum.Enum("Kind", {s.name: s.name for s in schedulers.batch()}, type=str)

SUBMIT_HELP = """Write a {kind} job script for SPEC and submit it with {cmd}; print the job id and the log path.

SPEC is a job spec YAML (or the name of a shipped example such as {example}); its scheduler: block
gives account, queue, walltime and the rest, over the site profile's defaults. The script runs
`sprite run` with the spec, so the launch inside the job is the plan of sprite run; --dry-run prints
the script and, after it as comments, that launch line. Secrets (secrets: names, or names such as
*_TOKEN) are taken from this shell's environment at submission and never written; the script is
created readable by you only.

\b
Examples:
  sprite {cmd} --dry-run {example}      # print the script, submit nothing
  sprite {cmd} my.job.yaml
  sprite {cmd} --json my.job.yaml       # {{"job_id": ..., "script": ..., "log": ...}}
"""


def _job_id(value: str) -> str:
    from sprite.schedulers import allocation

    if not allocation.JOB_ID.fullmatch(value):
        raise UsageError(f"{show(value)} is not a job id.", "Job ids are numbers or names such as 123.server.",
                         "Pass the id that sprite qsub/sbatch printed.")
    return value


def _submit(spec_name: str, scheduler: Scheduler, dry_run: bool, json_out: bool = False,
            allow_literal_secrets: bool = False) -> None:
    from sprite.jobs import submit

    prepared = submit.prepare(spec_name, scheduler.name, allow_literal_secrets=allow_literal_secrets)
    for warning in prepared.warnings:
        print(f"sprite: warning: {warning}", file=sys.stderr, flush=True)
    record = {"scheduler": scheduler.name, "script": prepared.script_path, "log": prepared.log_path,
              "launch": list(prepared.launch), "warnings": list(prepared.warnings)}
    if dry_run:
        if json_out:
            typer.echo(json.dumps({**record, "dry_run": True, "script_text": prepared.text}, indent=2))
        else:
            typer.echo(prepared.dry_run_text(), nl=False)
        return
    job_id, prepared = submit.submit(prepared)
    record.update(job_id=job_id, script=prepared.script_path, log=prepared.log_path.replace("%j", job_id))
    if json_out:
        typer.echo(json.dumps(record, indent=2))
        return
    typer.echo(f"submitted {scheduler.name} job {job_id}")
    typer.echo(f"script  {prepared.script_path}")
    typer.echo(f"log     {record['log']}")


def _register_submit(app: typer.Typer, scheduler: Scheduler) -> None:
    help_text = SUBMIT_HELP.format(kind=scheduler.label, cmd=scheduler.submit_program, example=scheduler.example_spec)

    @app.command(scheduler.submit_program, help=help_text)
    def submit_command(spec: str = typer.Argument(..., help="job spec YAML or a shipped example name"),
                       dry_run: bool = typer.Option(False, "--dry-run",
                                                    help="print the job script instead of submitting"),
                       json_out: bool = typer.Option(False, "--json", help="print job id, script and log as JSON"),
                       allow_literal_secrets: bool = typer.Option(
                           False, "--allow-literal-secrets",
                           help="accept a literal value for a secret in the spec (passed through the submit "
                                "command's environment, never written into the script)")):
        _submit(spec, scheduler, dry_run, json_out, allow_literal_secrets)


def register(app: typer.Typer) -> None:
    """Add the scheduler commands to ``app`` (imports nothing heavy; no torch or lightning)."""
    for scheduler in schedulers.batch():
        _register_submit(app, scheduler)

    scheduler_opt = typer.Option(None, "--scheduler", help="default: the site's, else the client on PATH")
    site_opt = typer.Option(None, "--site", help="site profile whose scheduler to ask")
    job_id_arg = typer.Argument(..., help="the job id sprite qsub/sbatch printed")

    @app.command("status", help="Show a job's state (qstat / squeue, or scontrol once it left the queue).\n\n"
                                "With --json: one record read from the scheduler's own JSON (qstat -x -f -F json, "
                                "squeue --json, scontrol --json): job_id, name, state, reason, exit_code, nodes, "
                                "log, source.\n\nExample: sprite status 1234")
    def status(job_id: str = job_id_arg, scheduler: Optional[Kind] = scheduler_opt,
               site: Optional[str] = site_opt,
               json_out: bool = typer.Option(False, "--json", help="print the job's record as JSON")):
        from sprite.jobs import clients

        chosen = clients.pick(_kind(scheduler), site)
        if json_out:
            typer.echo(json.dumps(clients.status_record(_job_id(job_id), chosen), indent=2))
        else:
            typer.echo(clients.status(_job_id(job_id), chosen))

    @app.command("cancel", help="Cancel a job (qdel / scancel).\n\nExample: sprite cancel 1234")
    def cancel(job_id: str = job_id_arg, scheduler: Optional[Kind] = scheduler_opt,
               site: Optional[str] = site_opt):
        from sprite.jobs import clients

        clients.cancel(_job_id(job_id), clients.pick(_kind(scheduler), site))
        typer.echo(f"cancel requested for job {job_id}")


def _kind(choice: Optional[enum.Enum]) -> Optional[str]:
    return choice.value if choice is not None else None
