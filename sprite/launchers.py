"""One argv builder per launcher flavour (``contract.LAUNCHER_FLAVOURS``), each a pure function.

Every builder takes (site, world, ctx, rank command, rank env) and returns the launcher's argument list; the
rank command is ``python -m sprite.runtime SCRIPT ARGS`` and the environment is the plan's, the same for all.
"""

from __future__ import annotations

from sprite import contract, schedulers


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
    return schedulers.get(world.alloc.scheduler).per_node_agents(world.nodes, world.hosts, argv)


def _local(site, world, ctx, cmd, env):
    return [ctx.python, "-m", "sprite.supervisor", "--nproc", str(world.devices), "--", *cmd]


# One argv builder per contract.LAUNCHER_FLAVOURS entry: (site, world, ctx, rank command, rank env) -> argv.
BUILDERS = {"pals": _pals, "hydra": _hydra, "openmpi": _openmpi, "srun": _srun, "torchrun": _torchrun,
            "local": _local}
assert set(BUILDERS) == set(contract.LAUNCHER_FLAVOURS)
