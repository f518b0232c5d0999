"""From what the user typed to a LaunchPlan: spec file + site profile + flags + allocation.

This is the one path `sprite run`, the job scripts and the parity harness all plan through.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path
from typing import Mapping

from sprite import allocation, contract, plan, sites, spec, yamlsrc, world
from sprite.errors import UsageError
from sprite.plan import LaunchPlan


def assemble(flags: dict, spec_file: str | None = None,
             environ: Mapping[str, str] = os.environ) -> tuple[spec.JobSpec, sites.SiteProfile]:
    """Merge site profile defaults, the spec file and validated flags. Raises UsageError / SpecError."""
    file_layer = spec.from_document(yamlsrc.load(spec_file)) if spec_file else {}
    flag_layer = spec.from_flags(flags)
    if "script" in flag_layer:
        flag_layer["script"] = str(Path(flag_layer["script"]).resolve())
    if flag_layer.get("resume", "never") not in contract.RESUME_MODES:
        flag_layer["resume"] = str(Path(flag_layer["resume"]).resolve())
    site_name = flag_layer.get("site") or file_layer.get("site") or environ.get("SPRITE_SITE") or "local"
    site = sites.load(site_name)
    # Ranks per node from the site are only a default: the allocation's own count outranks it (world.py).
    defaults = {key: value for key, value in site.job.items() if key != "devices"}
    job = spec.merge(defaults, file_layer, flag_layer, {"site": site.name})
    check_script(job.script)
    check_resume(job.resume)
    return job, site


def check_script(script: str | None) -> None:
    """Raise UsageError unless ``script`` names an existing file."""
    if not script:
        raise UsageError("No training script given.", "", "Pass SCRIPT after sprite's options, or set script: in --spec.")
    if not os.path.isfile(script):
        raise UsageError(
            f"The training script {script} does not exist.",
            "The path is misspelled or relative to another folder (spec paths are relative to the spec file).",
            "Pass the path of an existing Python file.",
        )


def check_resume(resume: str) -> None:
    """Raise UsageError unless ``resume`` is never, auto or an existing checkpoint (a file or a folder)."""
    if resume not in contract.RESUME_MODES and not os.path.exists(resume):
        raise UsageError(f"--resume {resume}: no such checkpoint.", "The path is misspelled, or relative to"
                         " another folder (spec paths are relative to the spec file).",
                         "Pass never, auto, or the path of an existing checkpoint file or folder.")


def context(environ: Mapping[str, str]) -> plan.Context:
    """The launching process's facts (interpreter, environment, root or not)."""
    return plan.Context(python=sys.executable, environ=dict(environ), is_root=os.geteuid() == 0)


def plan_run(flags: dict, environ: Mapping[str, str] = os.environ, spec_file: str | None = None) -> LaunchPlan:
    """The LaunchPlan for ``flags`` (JobSpec field names) in the allocation ``environ`` describes.

    Raises UsageError (SpecError for a spec file) for bad input or a world the allocation cannot hold.
    """
    job, site = assemble(flags, spec_file, environ)
    alloc = allocation.discover(environ, hostname=socket.gethostname())
    launched = world.resolve(job, site, alloc)
    return plan.build(job, site, launched, context(environ))
