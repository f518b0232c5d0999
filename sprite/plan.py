"""LaunchPlan: the argument list and environment that start every rank, built by pure functions.

One builder per launcher flavour turns (spec, site, world) into argv; the environment is the same for all
of them. A plan is a value: print it (``--dry-run``), compare it in a test, then execute it.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from typing import Callable

from sprite import contract
from sprite import rendezvous
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


def _pals(site, world, ctx, cmd, env):
    argv = ["mpiexec", "-n", str(world.size), "--ppn", str(world.devices)]
    if site.cpu_bind:
        argv += ["--cpu-bind", site.cpu_bind]
    if site.depth:
        argv += ["--depth", str(site.depth)]
    if world.subset:
        argv += ["--hosts", ",".join(world.hosts)]
    return argv + ["--envall", *cmd]


def _hydra(site, world, ctx, cmd, env):
    argv = ["mpiexec", "-n", str(world.size), "-ppn", str(world.devices)]
    if world.alloc.scheduler != "none":
        argv += ["-hosts", ",".join(world.hosts)]
    return argv + cmd


def _openmpi(site, world, ctx, cmd, env):
    argv = ["mpirun", "-n", str(world.size), "--map-by", f"ppr:{world.devices}:node"]
    if world.alloc.scheduler != "none":
        argv += ["--host", ",".join(f"{h}:{world.devices}" for h in world.hosts)]
    else:
        argv += ["--oversubscribe"]  # Open MPI 5 counts cores, not ranks, on a laptop (FACTS.md, 2 cores here)
    if ctx.is_root:
        argv += ["--allow-run-as-root"]
    for name in sorted(env):  # Open MPI forwards no environment unless told (-x NAME)
        argv += ["-x", name]
    return argv + cmd


def _srun(site, world, ctx, cmd, env):
    argv = ["srun", "--nodes", str(world.nodes), "--ntasks", str(world.size),
            "--ntasks-per-node", str(world.devices)]
    if world.subset:
        argv += ["--nodelist", ",".join(world.hosts)]
    if site.cpus_per_task:
        argv += ["--cpus-per-task", str(site.cpus_per_task)]
    if site.cpu_bind:
        argv += [f"--cpu-bind={site.cpu_bind}"]
    return argv + ["--kill-on-bad-exit=1", "--export=ALL", *cmd]


def _torchrun(site, world, ctx, cmd, env):
    endpoint = f"{env[contract.MASTER_ADDR]}:{env[contract.MASTER_PORT]}"
    argv = [ctx.python, "-m", "torch.distributed.run", "--nnodes", str(world.nodes),
            "--nproc-per-node", str(world.devices), "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint,
            "--rdzv-id", world.alloc.job_id or "sprite", "-m", *cmd[2:]]
    if world.nodes == 1:
        return argv
    # One torchrun agent per node, started by the scheduler's own launcher.
    if world.alloc.scheduler == "slurm":
        return ["srun", "--nodes", str(world.nodes), "--ntasks", str(world.nodes), "--ntasks-per-node", "1",
                "--nodelist", ",".join(world.hosts), "--kill-on-bad-exit=1", "--export=ALL", *argv]
    return ["mpiexec", "-n", str(world.nodes), "--ppn", "1", "--hosts", ",".join(world.hosts), "--envall", *argv]


def _local(site, world, ctx, cmd, env):
    return [ctx.python, "-m", "sprite.supervisor", "--nproc", str(world.devices), "--", *cmd]


# One argv builder per contract.LAUNCHER_FLAVOURS entry: (site, world, ctx, rank command, rank env) -> argv.
BUILDERS = {"pals": _pals, "hydra": _hydra, "openmpi": _openmpi, "srun": _srun, "torchrun": _torchrun,
            "local": _local}
assert set(BUILDERS) == set(contract.LAUNCHER_FLAVOURS)


def build(spec: JobSpec, site: SiteProfile, world: World, ctx: Context) -> LaunchPlan:
    """The plan that starts ``world`` running ``spec``. Pure: reads nothing but its arguments."""
    env = environment(spec, site, world, ctx)
    argv = BUILDERS[world.flavour](site, world, ctx, rank_command(spec, ctx), env)
    return LaunchPlan(argv, env, world)
