"""From what the user typed to a LaunchPlan: spec file + site profile + flags + allocation -> argv and env.

This is the one path `sprite run`, the job scripts and the harnesses (parity, ckpt-check, bench) plan through.
A plan is a value: print it (``--dry-run``), compare it in a test, then execute it (``sprite.launch.execute``). The
argv comes from one builder per launcher flavour (``sprite.launch.launchers``); the environment is the same for all.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import sys
from dataclasses import dataclass, field, replace
from typing import Callable, Mapping

from sprite import contract, schedulers
from sprite.launch import devicecount
from sprite.launch import launchers
from sprite.contract import preemption
from sprite.contract import console
from sprite.contract import stacks
from sprite.launch import rank_output
from sprite.launch import rendezvous
from sprite.spec import secrets as secret_env
from sprite.spec import sites
from sprite.launch import world
from sprite.spec import yamldoc
from sprite.spec import job as specmod
from sprite.schedulers.allocation import Allocation
from sprite.errors import UsageError
from sprite.spec.sites import SiteProfile
from sprite.spec.job import JobSpec
from sprite.launch.world import World


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
    notes: tuple[str, ...] = ()  # what sprite decided over the caller's environment, for stderr
    secret: frozenset = frozenset()
    output_notes: tuple[str, ...] = ()  # where the ranks' output goes (console filter, log files), before launch
    log_dir: str | None = None  # every rank's DIR/rank<N>.log; made fresh before the ranks start
    stage: object = None  # sprite.launch.stage.plan.StagePlan under --stage: the ranks run a node-local copy

    def to_json(self) -> str:
        shown = {"argv": self.argv, "env": secret_env.mask(self.env, self.secret)}
        if self.stage is not None:
            shown["stage"] = {"dir": self.stage.dir, "python": self.stage.python, "hosts": list(self.stage.hosts),
                              "broadcast": self.stage.broadcast, "cache": self.stage.cache, "keep": self.stage.keep}
        return json.dumps(shown, indent=2)

    def describe(self) -> str:
        w = self.world
        hosts = ", ".join(w.hosts[:3]) + (f", ... ({len(w.hosts)} hosts)" if len(w.hosts) > 3 else "")
        lines = [
            f"launcher   {w.launcher} ({w.flavour})",
            f"world      {w.nodes} node(s) x {w.devices} rank(s) = {w.size} ranks",
            f"hosts      {hosts}",
            f"scheduler  {w.alloc.scheduler}" + (f", job {w.alloc.job_id}" if w.alloc.job_id else ""),
            "command    " + shlex.join(self.argv),
            *(f"output     {note}" for note in self.output_notes),
            *([f"stage      {self.stage.describe()}"] if self.stage is not None else []),
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
    addr = "127.0.0.1" if local else rendezvous.master_addr(world.hosts, site.rendezvous_domain)
    port = rendezvous.master_port(world.alloc.job_id, spec.master_port, ctx.pick_free_port,
                                  ctx.run_env.get(contract.ATTEMPT, ""))
    given = secret_env.resolve(spec, ctx.environ)  # the site's and the spec's env, --env among them
    env = dict(given)
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
        contract.PREEMPT_SIGNAL: preemption.effective(spec.preempt_signal),
    })
    env.update(cadence_env(spec))
    if spec.checkpoint_writer:
        env[contract.CHECKPOINT_WRITER] = spec.checkpoint_writer
    # run_env's recorder size is a default: one the user gave in env or --env, under either name, is kept
    user_recorder = {stacks.RECORDER_BUFFER, stacks.RECORDER_OLD_BUFFER} & set(given)
    env.update({name: value for name, value in ctx.run_env.items()
                if not (user_recorder and name == stacks.RECORDER_BUFFER)})
    env.update(rank_output.rank_env(world.flavour, world.size, spec.log_dir, spec.ranks))
    return env


def cadence_env(spec: JobSpec) -> dict:
    """The ``--checkpoint-every`` variables (none without it; an ``mtbf`` alone, e.g. a site profile's, is
    unused). Raises UsageError for ``auto`` without an MTBF, or ``--keep`` or ``--mtbf`` given as a flag without a
    cadence."""
    if spec.checkpoint_every is None:
        if spec.keep is not None:
            raise UsageError(f"{spec.blame('keep')} keeps sprite's own checkpoints, and it saves none.",
                             "It only applies with --checkpoint-every.",
                             "Add --checkpoint-every DURATION (or auto), or drop it.")
        if spec.mtbf is not None and "mtbf" not in spec.origins:  # the flag itself, not a profile's default
            raise UsageError(f"{spec.blame('mtbf')} sets the checkpoint interval of --checkpoint-every auto, and "
                             "there is none.", "It only applies with --checkpoint-every auto.",
                             "Add --checkpoint-every auto, or drop --mtbf.")
        return {}
    if spec.checkpoint_every == "auto" and spec.mtbf is None:
        raise UsageError(f"{spec.blame('checkpoint_every')} needs the mean time between failures.",
                         "auto computes the interval from it (Young/Daly: sqrt(2 x save stall x MTBF)).",
                         "Add --mtbf DURATION (e.g. --mtbf 24h), or mtbf: in the site profile's job: block.")
    env = {contract.CHECKPOINT_EVERY: spec.checkpoint_every, contract.KEEP: str(spec.keep or 2)}
    if spec.mtbf is not None:
        env[contract.MTBF] = repr(spec.mtbf)
    return env


def build(spec: JobSpec, site: SiteProfile, world: World, ctx: Context) -> LaunchPlan:
    """The plan that starts ``world`` running ``spec``. Pure: reads nothing but its arguments.

    Raises UsageError for a preemption signal the launcher would not pass on, or ``requeue`` outside a batch job.
    """
    preemption.check_launcher(spec.preempt_signal, world.flavour)
    if spec.requeue and not world.alloc.job_id:
        raise UsageError("--requeue asks the batch system to run this job again, and this is no batch job.",
                         "Job scripts written by `sprite qsub`/`sprite sbatch` pass it when the spec says requeue.",
                         "Drop --requeue (or requeue: true) here, or submit the spec as a job.")
    check_output_options(spec, world)
    spec = replace(spec, log_dir=console.attempt_dir(spec.log_dir, ctx.run_env.get(contract.ATTEMPT)))
    env = environment(spec, site, world, ctx)
    site = replace(site, cpu_bind=spec.cpu_bind) if spec.cpu_bind else site
    staged = stage_plan(spec, site, world, ctx)
    command = rank_command(spec, ctx if staged is None else replace(ctx, python=staged.python))
    argv = launchers.BUILDERS[world.flavour](site, world, ctx, command, env)
    argv = rank_output.launch_argv(world.flavour, argv, world.size, spec.log_dir, spec.ranks, ctx.python)
    return LaunchPlan(argv, env, world, secret=secret_env.names(spec, site),
                      output_notes=tuple(rank_output.notes(world.size, spec.log_dir, spec.ranks)),
                      log_dir=spec.log_dir, stage=staged)


def stage_plan(spec: JobSpec, site: SiteProfile, world: World, ctx: Context):
    """The StagePlan of ``--stage`` (None when off). Raises UsageError for --keep-stage without --stage."""
    if spec.stage == "off":
        if spec.keep_stage:
            where = spec.origins.get("keep_stage", "--keep-stage")
            raise UsageError(f"{where} keeps a staged copy, and nothing is staged.", "",
                             "Add --stage auto (or --stage DIR), or drop --keep-stage.")
        return None
    from sprite.launch.stage import plan as staging

    return staging.build(spec, site, world, ctx.python, ctx.environ, ctx.run_env, ctx.is_root)


CPU_BIND_FLAVOURS = ("pals", "srun")  # the builders in sprite.launch.launchers that pass --cpu-bind on


def check_output_options(spec: JobSpec, world: World) -> None:
    """Refuse what the launcher of ``world`` would misread or drop: a rank-log folder its file pattern would
    fill in, a console filter naming no rank, a ``cpu_bind`` it has no option for. Raises UsageError naming where
    the value was given (the flag, or the spec's file, line and key)."""
    if spec.log_dir:
        why = rank_output.pattern_problem(world.flavour, spec.log_dir)
        if why:
            raise UsageError(f"{spec.blame('log_dir')}: the rank-log folder {why}.",
                             f"The {world.flavour} launcher writes each rank's file through its own file pattern.",
                             "Choose a folder whose path has no such character.")
    if spec.ranks and not console.members(spec.ranks, world.size):
        raise UsageError(f"{spec.blame('ranks')} names no rank of this launch, which has ranks 0-{world.size - 1}.",
                         "", "Name ranks below the world size, or all.")
    if spec.cpu_bind and world.flavour not in CPU_BIND_FLAVOURS:
        raise UsageError(f"{spec.blame('cpu_bind')}: the {world.flavour} launcher has no --cpu-bind, so it would "
                         "be dropped.", "Only PALS mpiexec and srun bind ranks to cores from sprite's plan.",
                         "Drop cpu_bind, or launch with PALS mpiexec or srun.")


def assemble(flags: dict, spec_file: str | None = None, environ: Mapping[str, str] = os.environ,
             allow_literal_secrets: bool = False) -> tuple[JobSpec, SiteProfile]:
    """Merge site profile defaults, the spec file and validated flags.

    Raises UsageError / SpecError; UsageError for a secret given a literal value unless ``allow_literal_secrets``.
    """
    doc = yamldoc.load(spec_file) if spec_file else None
    file_layer = specmod.from_document(doc) if doc else {}
    flag_layer = specmod.from_flags(flags)
    for key in ("script", "resume", "log_dir"):
        if key in flag_layer and (key != "resume" or flag_layer[key] not in contract.RESUME_MODES):
            flag_layer[key] = specmod.absolute(flag_layer[key])
    site = sites.choose(flag_layer, file_layer, doc, environ)
    # Ranks per node from the site are only a default: the allocation's own count outranks it (world.py).
    defaults = {key: value for key, value in site.job.items() if key != "devices"}
    origins = {**site.origins, **(specmod.origins(doc, file_layer) if doc else {})}
    origins = {key: where for key, where in origins.items() if key not in flag_layer}
    job = specmod.merge(defaults, file_layer, flag_layer, {"site": site.name, "origins": origins})
    sites.check_limits(job, site)
    specmod.check_script(job, doc)
    check_resume(job)
    written = ((f"the site profile {site.source}", defaults), (f"the spec {spec_file}", file_layer),
               ("--env NAME=VALUE", flag_layer))
    sources = {name: where for where, layer in written for name in layer.get("env", {})}
    secret_env.check_literals(job, site, allow_literal_secrets, sources)
    return job, site


def check_resume(job: JobSpec) -> None:
    """Raise UsageError unless ``resume`` is never, auto or an existing checkpoint (a file or a folder)."""
    if job.resume in contract.RESUME_MODES:
        return
    if not os.path.exists(job.resume):
        raise UsageError(f"{job.blame('resume')}: no such checkpoint.", "The path is misspelled, or relative to"
                         " another folder (spec paths are relative to the spec file).",
                         "Pass never, auto, or the path of an existing checkpoint file or folder.")
    from sprite.integrity import manifest_path

    if not os.path.lexists(manifest_path(job.resume)):  # the ranks would refuse it after starting Lightning
        raise UsageError(f"{job.blame('resume')}: the checkpoint has no sprite manifest "
                         f"({manifest_path(job.resume).name}).", "It was not saved under sprite run, or its save was"
                         " cut short; sprite resumes only from checkpoints it sealed, since loading one runs its "
                         "pickle.", "Pass a checkpoint sprite saved (sprite ckpt list shows them), or --resume auto.")


def context(environ: Mapping[str, str], run_env: Mapping[str, str] | None = None) -> Context:
    """The launching process's facts (interpreter, environment, root or not, this invocation's run variables)."""
    return Context(python=sys.executable, environ=dict(environ), is_root=os.geteuid() == 0,
                   run_env=dict(run_env or {}))


def plan_run(flags: dict, environ: Mapping[str, str] = os.environ, spec_file: str | None = None,
             allow_literal_secrets: bool = False, run_env: Mapping[str, str] | None = None,
             fewest_ranks: int = 1) -> LaunchPlan:
    """The LaunchPlan for ``flags`` (JobSpec field names) in the allocation ``environ`` describes; ``run_env``
    (run folder, attempt) goes to every rank; ``fewest_ranks``, the smallest world the caller accepts (a check
    that compares a distributed run needs 2), keeps a refusal from suggesting fewer.

    Raises UsageError (SpecError for a spec file) for bad input, a world the allocation cannot hold, a secret
    with a literal value (unless ``allow_literal_secrets``) or one that ``environ`` does not set.
    """
    job, site = assemble(flags, spec_file, environ, allow_literal_secrets)
    alloc = schedulers.discover(environ, hostname=socket.gethostname())
    check_site_scheduler(site, alloc)
    here = None
    if alloc.scheduler == "none" and not job.devices and not site.job.get("devices"):
        here = devicecount.default_ranks(job.accelerator, environ)  # as Trainer(devices="auto") would
    launched = world.resolve(job, site, alloc, here)
    if alloc.scheduler == "none":
        check_devices_here(job, launched.devices, environ, fewest_ranks)
    plan = build(job, site, launched, context(environ, run_env))
    too_long = check_exec_limits(plan, refuse=False)  # planned all the same (a dry run shows it), never started
    notes = (*schedulers.detection_notes(environ), *rendezvous.replaced(environ, plan.env),
             *([f"this plan cannot be started: {too_long}"] if too_long else []))
    return replace(plan, notes=notes)


MAX_ARG_STRLEN = 131072  # Linux's limit on one argument or one NAME=VALUE string (32 pages: binfmts.h)


def check_exec_limits(plan: LaunchPlan, refuse: bool = True) -> str | None:
    """Whether the kernel would start ``plan``: an argument or a variable over ``MAX_ARG_STRLEN`` (the host list of
    some 2,600 Aurora nodes, whose node-file names are 50 characters, or of about 9,300 with 13-character names)
    is refused by execve with E2BIG. sprite passes the hosts as one list to every rank (``SPRITE_HOSTS``) and, for a
    part of the allocation, to the launcher; a host file is not yet written. Returns what is too long, or None;
    raises UsageError with it when ``refuse``."""
    texts = [("an argument of the launch", arg) for arg in plan.argv]
    texts += [(f"the variable {name}", f"{name}={value}") for name, value in plan.env.items()]
    for what, text in texts:
        size = len(text.encode("utf-8", "surrogateescape"))
        if size >= MAX_ARG_STRLEN:
            problem = (f"{what} is {size:,} bytes, over Linux's {MAX_ARG_STRLEN:,}-byte limit for one argument "
                       f"or variable ({len(plan.world.hosts):,} hosts)")
            if refuse:
                raise UsageError(f"The launch cannot be started: {problem}.",
                                 "sprite passes the host list as one variable (and one argument), and these hosts' "
                                 "names make it too long; a host file is not yet supported.",
                                 "Run on fewer nodes (about 2,500 with 50-character names), or with shorter host "
                                 "names.")
            return problem
    return None


def check_site_scheduler(site, alloc) -> None:
    """Refuse a site profile of one batch system inside an allocation of another (a PBS site's PALS ``mpiexec``
    inside a Slurm job, say: a stale ``$SPRITE_SITE``). A site without a scheduler (local) runs in any allocation,
    and any site plans on a machine outside one (a login node). Raises UsageError."""
    if "none" in (site.scheduler, alloc.scheduler) or site.scheduler == alloc.scheduler:
        return
    raise UsageError(f"The site profile {site.name} is for {site.scheduler.upper()} jobs, and this is a "
                     f"{alloc.scheduler.upper()} allocation (job {alloc.job_id or '?'}).",
                     "The site came from --site, the spec's site: or $SPRITE_SITE, which may be left from another "
                     "machine; its launcher and flags do not work here.",
                     f"Pass --site with a {alloc.scheduler.upper()} site (or local), or unset SPRITE_SITE.")


def check_devices_here(job: JobSpec, ranks: int, environ: Mapping[str, str], fewest_ranks: int = 1) -> None:
    """On this machine alone: refuse more ranks than the devices they would run on (a rank takes a device of its
    own, and NCCL refuses two ranks on one GPU). Nothing is checked where no device of the kind is seen (a
    planning machine without nvidia-smi, or CPU ranks), nor for ``--accelerator auto`` unless the installed torch
    says it was built for that kind of device (with a CPU build, auto runs CPU ranks). Fewer devices is suggested
    only down to ``fewest_ranks``. Raises UsageError."""
    kind, count = devicecount.of(job.accelerator, environ)
    if job.accelerator == "auto" and devicecount.torch_build() != kind:
        return
    if kind != "cpu" and 0 < count < ranks:
        asked = job.blame("devices") if job.devices else f"The site's devices ({ranks})"
        raise UsageError(f"{asked} puts {ranks} ranks on this machine, which shows {count} {kind} device(s).",
                         "Every rank takes a device of its own; a second rank on one GPU fails.",
                         f"Use --accelerator cpu for CPU ranks, a machine with {ranks} {kind} devices"
                         + (f", or --devices {count} or fewer." if count >= fewest_ranks else "."))


def plan_in(job: JobSpec, site: SiteProfile, alloc: Allocation, python: str) -> LaunchPlan:
    """The plan ``job`` would get inside ``alloc`` (a requested allocation, before submission): the same
    checks as ``sprite run`` in the job. Variables the job takes from the submitting environment get empty
    stand-ins (submit checks they are set). Raises UsageError for a world the allocation cannot hold."""
    stand_ins = dict.fromkeys(secret_env.from_caller(job), "")
    return build(job, site, world.resolve(job, site, alloc), Context(python=python, environ=stand_ins))
