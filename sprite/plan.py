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

from sprite import allocation, contract, launchers, rendezvous, secret_env, sites, world, yamldoc
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
    run_env: dict = field(default_factory=dict)  # this invocation's contract variables: run folder, attempt


@dataclass(frozen=True)
class LaunchPlan:
    """``argv`` to execute with ``env`` laid over the caller's environment; ``world`` is what it launches.

    ``secret`` names the variables of ``env`` that are secrets: printed masked, and never part of ``argv``.
    """

    argv: list[str]
    env: dict[str, str]
    world: World
    cwd: str | None = None
    secret: frozenset = frozenset()

    def to_json(self) -> str:
        return json.dumps({"argv": self.argv, "env": secret_env.mask(self.env, self.secret)}, indent=2)

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
        shown = secret_env.mask(self.env, self.secret)
        lines += [f"  {key}={shlex.quote(value)}" for key, value in sorted(shown.items())]
        return "\n".join(lines)


def rank_command(spec: JobSpec, ctx: Context) -> list[str]:
    """What every rank runs: the runtime entry point with the user's script and its arguments."""
    return [ctx.python, "-m", "sprite.runtime", spec.script or "", *spec.args]


def environment(spec: JobSpec, site: SiteProfile, world: World, ctx: Context) -> dict[str, str]:
    """Every variable sprite sets or overrides for the ranks: site and spec env (secrets and ``pass_env`` names
    with their values in ``ctx.environ``), rendezvous and the contract. Raises UsageError for an unset secret."""
    local = world.launcher == "local" or (world.alloc.scheduler == "none" and world.nodes == 1)
    addr = "127.0.0.1" if local else rendezvous.master_addr(ctx.environ, world.hosts)
    port = rendezvous.master_port(ctx.environ, world.alloc.job_id, spec.master_port, ctx.pick_free_port)
    env = secret_env.resolve(spec, ctx.environ)
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
        contract.RESUME: spec.resume,
        contract.CHECKS: spec.checks,
    })
    env.update(ctx.run_env)
    return env


def build(spec: JobSpec, site: SiteProfile, world: World, ctx: Context) -> LaunchPlan:
    """The plan that starts ``world`` running ``spec``. Pure: reads nothing but its arguments."""
    env = environment(spec, site, world, ctx)
    argv = launchers.BUILDERS[world.flavour](site, world, ctx, rank_command(spec, ctx), env)
    return LaunchPlan(argv, env, world, secret=secret_env.names(spec, site))


def assemble(flags: dict, spec_file: str | None = None, environ: Mapping[str, str] = os.environ,
             allow_literal_secrets: bool = False) -> tuple[JobSpec, SiteProfile]:
    """Merge site profile defaults, the spec file and validated flags.

    Raises UsageError / SpecError; UsageError for a secret given a literal value unless ``allow_literal_secrets``.
    """
    file_layer = specmod.from_document(yamldoc.load(spec_file)) if spec_file else {}
    flag_layer = specmod.from_flags(flags)
    if "script" in flag_layer:
        flag_layer["script"] = str(Path(flag_layer["script"]).resolve())
    if flag_layer.get("resume", "never") not in contract.RESUME_MODES:
        flag_layer["resume"] = str(Path(flag_layer["resume"]).resolve())
    site_name = flag_layer.get("site") or file_layer.get("site") or environ.get("SPRITE_SITE") or "local"
    site = sites.load(site_name)
    # Ranks per node from the site are only a default: the allocation's own count outranks it (world.py).
    defaults = {key: value for key, value in site.job.items() if key != "devices"}
    job = specmod.merge(defaults, file_layer, flag_layer, {"site": site.name})
    check_script(job.script)
    check_resume(job.resume)
    written = ((f"the site profile {site.source}", defaults), (f"the spec {spec_file}", file_layer),
               ("--env NAME=VALUE", flag_layer))
    sources = {name: where for where, layer in written for name in layer.get("env", {})}
    secret_env.check_literals(job, site, allow_literal_secrets, sources)
    return job, site


def check_resume(resume: str) -> None:
    """Raise UsageError unless ``resume`` is never, auto or an existing checkpoint (a file or a folder)."""
    if resume not in contract.RESUME_MODES and not os.path.exists(resume):
        raise UsageError(f"--resume {resume}: no such checkpoint.", "The path is misspelled, or relative to"
                         " another folder (spec paths are relative to the spec file).",
                         "Pass never, auto, or the path of an existing checkpoint file or folder.")


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


def context(environ: Mapping[str, str], run_env: Mapping[str, str] | None = None) -> Context:
    """The launching process's facts (interpreter, environment, root or not, this invocation's run variables)."""
    return Context(python=sys.executable, environ=dict(environ), is_root=os.geteuid() == 0,
                   run_env=dict(run_env or {}))


def plan_run(flags: dict, environ: Mapping[str, str] = os.environ, spec_file: str | None = None,
             allow_literal_secrets: bool = False, run_env: Mapping[str, str] | None = None) -> LaunchPlan:
    """The LaunchPlan for ``flags`` (JobSpec field names) in the allocation ``environ`` describes; ``run_env``
    (run folder, attempt) goes to every rank.

    Raises UsageError (SpecError for a spec file) for bad input, a world the allocation cannot hold, a secret
    with a literal value (unless ``allow_literal_secrets``) or one that ``environ`` does not set.
    """
    job, site = assemble(flags, spec_file, environ, allow_literal_secrets)
    alloc = allocation.discover(environ, hostname=socket.gethostname())
    launched = world.resolve(job, site, alloc)
    return build(job, site, launched, context(environ, run_env))
