"""From what the user typed to a LaunchPlan: spec file + site profile + flags + allocation -> argv and env.

This is the one path `sprite run`, the job scripts and the harnesses (parity, ckpt-check, bench) plan through.
A plan is a value: print it (``--dry-run``), compare it in a test, then execute it (``sprite.execute``). The
argv comes from one builder per launcher flavour (``sprite.launchers``); the environment is the same for all.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping

from sprite import allocation, contract, launchers, rendezvous, sites, world, yamldoc
from sprite import spec as specmod
from sprite.errors import UsageError
from sprite.sites import SiteProfile
from sprite.spec import JobSpec
from sprite.world import World


@dataclass(frozen=True)
class Context:
    """Facts about the launching process that builders need, passed in so builders stay pure."""

    python: str
    environ: dict = field(default_factory=dict)
    is_root: bool = False
    pick_free_port: Callable[[], int] = rendezvous.free_port  # called only when nothing else fixes the port


@dataclass(frozen=True)
class LaunchPlan:
    """``argv`` to execute with ``env`` laid over the caller's environment; ``world`` is what it launches."""

    argv: list[str]
    env: dict[str, str]
    world: World
    cwd: str | None = None

    def to_json(self) -> str:
        return json.dumps({"argv": self.argv, "env": self.env}, indent=2)

    def describe(self) -> str:
        w = self.world
        hosts = ", ".join(w.hosts[:3]) + (f", ... ({len(w.hosts)} hosts)" if len(w.hosts) > 3 else "")
        lines = [
            f"launcher   {w.launcher} ({w.flavour})",
            f"world      {w.nodes} node(s) x {w.devices} rank(s) = {w.size} ranks",
            f"hosts      {hosts}",
            f"scheduler  {w.alloc.scheduler}" + (f", job {w.alloc.job_id}" if w.alloc.job_id else ""),
            "command    " + shlex.join(self.argv),
            "environment",
        ]
        lines += [f"  {key}={shlex.quote(value)}" for key, value in sorted(self.env.items())]
        return "\n".join(lines)


def rank_command(spec: JobSpec, ctx: Context) -> list[str]:
    """What every rank runs: the runtime entry point with the user's script and its arguments."""
    return [ctx.python, "-m", "sprite.runtime", spec.script or "", *spec.args]


def environment(spec: JobSpec, site: SiteProfile, world: World, ctx: Context) -> dict[str, str]:
    """Every variable sprite sets or overrides for the ranks: site and spec env, rendezvous and the contract."""
    local = world.launcher == "local" or (world.alloc.scheduler == "none" and world.nodes == 1)
    addr = "127.0.0.1" if local else rendezvous.master_addr(ctx.environ, world.hosts)
    port = rendezvous.master_port(ctx.environ, world.alloc.job_id, spec.master_port, ctx.pick_free_port)
    env = {**spec.env}
    env.update({
        # `python -m sprite.runtime` started in a source checkout would import the checkout's sprite/ (the cwd
        # comes first on sys.path), which lacks the subpackages installation maps in (sprite.parity, sprite.conf):
        # Python >= 3.11 then leaves the cwd out, so every rank imports the installed package; older ones ignore it.
        "PYTHONSAFEPATH": "1",
        contract.MASTER_ADDR: addr,
        contract.MASTER_PORT: str(port),
        "WORLD_SIZE": str(world.size),
        contract.WORLD_SIZE: str(world.size),
        contract.NUM_NODES: str(world.nodes),
        contract.DEVICES: str(world.devices),
        contract.ACCELERATOR: spec.accelerator,
        contract.STRATEGY: spec.strategy,
        contract.PRECISION: spec.precision,
        contract.LAUNCHER: world.flavour,
        contract.HOSTS: ",".join(world.hosts),
        contract.JOB_ID: world.alloc.job_id,
        contract.SITE: site.name,
        contract.CHECKS: spec.checks,
    })
    return env


def build(spec: JobSpec, site: SiteProfile, world: World, ctx: Context) -> LaunchPlan:
    """The plan that starts ``world`` running ``spec``. Pure: reads nothing but its arguments."""
    env = environment(spec, site, world, ctx)
    argv = launchers.BUILDERS[world.flavour](site, world, ctx, rank_command(spec, ctx), env)
    return LaunchPlan(argv, env, world)


def assemble(flags: dict, spec_file: str | None = None,
             environ: Mapping[str, str] = os.environ) -> tuple[JobSpec, SiteProfile]:
    """Merge site profile defaults, the spec file and validated flags. Raises UsageError / SpecError."""
    file_layer = specmod.from_document(yamldoc.load(spec_file)) if spec_file else {}
    flag_layer = specmod.from_flags(flags)
    if "script" in flag_layer:
        flag_layer["script"] = str(Path(flag_layer["script"]).resolve())
    site_name = flag_layer.get("site") or file_layer.get("site") or environ.get("SPRITE_SITE") or "local"
    site = sites.load(site_name)
    # Ranks per node from the site are only a default: the allocation's own count outranks it (world.py).
    defaults = {key: value for key, value in site.job.items() if key != "devices"}
    job = specmod.merge(defaults, file_layer, flag_layer, {"site": site.name})
    check_script(job.script)
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


def context(environ: Mapping[str, str]) -> Context:
    """The launching process's facts (interpreter, environment, root or not)."""
    return Context(python=sys.executable, environ=dict(environ), is_root=os.geteuid() == 0)


def plan_run(flags: dict, environ: Mapping[str, str] = os.environ, spec_file: str | None = None) -> LaunchPlan:
    """The LaunchPlan for ``flags`` (JobSpec field names) in the allocation ``environ`` describes.

    Raises UsageError (SpecError for a spec file) for bad input or a world the allocation cannot hold.
    """
    job, site = assemble(flags, spec_file, environ)
    alloc = allocation.discover(environ, hostname=socket.gethostname())
    launched = world.resolve(job, site, alloc)
    return build(job, site, launched, context(environ))
