"""One argv builder per launcher flavour (``contract.LAUNCHER_FLAVOURS``), each a pure function.

Every builder takes (site, world, ctx, rank command, rank env) and returns the launcher's argument list; the
rank command is ``python -m sprite.runtime SCRIPT ARGS`` and the environment is the plan's, the same for all.
The environment reaches the ranks through the launcher's own environment, never as values in the argument list
(every user of the node can read any process's command line in /proc): each builder uses its launcher's way of
passing the caller's environment on, by name at most.
"""

from __future__ import annotations

from dataclasses import replace

from sprite import contract, schedulers


def _pals(site, world, ctx, cmd, env):
    argv = ["mpiexec", "-n", str(world.size), "--ppn", str(world.devices)]
    if site.cpu_bind:
        argv += ["--cpu-bind", site.cpu_bind]
    if site.depth:
        argv += ["--depth", str(site.depth)]
    if world.subset:
        argv += ["--hosts", ",".join(world.hosts)]
    # PALS mpiexec --envall: every variable of mpiexec's environment to every rank (ALCF's Aurora/Polaris job
    # scripts, docs.alcf.anl.gov/aurora/running-jobs-aurora; HPE SmartSim's PalsMpiexecSettings passes names
    # with --envlist, values only with --env, which sprite never uses).
    return argv + ["--envall", *cmd]


def _hydra(site, world, ctx, cmd, env):
    argv = ["mpiexec", "-n", str(world.size), "-ppn", str(world.devices)]
    if world.alloc.scheduler != "none":
        argv += ["-hosts", ",".join(world.hosts)]
    # Hydra passes mpiexec's whole environment to every rank by default ("-genvall ... (default)" in `mpiexec
    # --help` of MPICH 5.0.2; MPICH's mpiexec.txt, src/pm/hydra/mansrc), so no -genv NAME VALUE is needed.
    return argv + cmd


def _openmpi(site, world, ctx, cmd, env):
    argv = ["mpirun", "-n", str(world.size), "--map-by", f"ppr:{world.devices}:node"]
    if world.alloc.scheduler != "none":
        argv += ["--host", ",".join(f"{h}:{world.devices}" for h in world.hosts)]
    else:
        argv += ["--oversubscribe"]  # Open MPI 5 counts cores, not ranks, on a laptop (FACTS.md, 2 cores here)
    if ctx.is_root:
        argv += ["--allow-run-as-root"]
    # Open MPI forwards no environment to remote ranks unless told; "-x NAME" exports NAME with its value in
    # mpirun's environment (mpirun(1), "-x <env>", manpages.ubuntu.com/manpages/noble/man1/mpirun.openmpi.1.html).
    for name in sorted(env):
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
    # --export=ALL: "all of the user's environment will be loaded from the caller's environment" (srun(1) of
    # Slurm 22.05, "--export"); spelled out because a step otherwise inherits sbatch's --export setting.
    return argv + ["--kill-on-bad-exit=1", "--export=ALL", *cmd]


def _torchrun(site, world, ctx, cmd, env):
    # Over several nodes the endpoint is the first host as the node file names it, not MASTER_ADDR: torch's c10d
    # rendezvous serves its store only on the agent whose hostname or addresses match the endpoint
    # (_matches_machine_hostname), and a site's high-speed-network alias (Aurora's .hsn name) matches none, so
    # every agent would wait for a store nobody starts.
    host = world.hosts[0] if world.nodes > 1 else env[contract.MASTER_ADDR]
    endpoint = f"{host}:{env[contract.MASTER_PORT]}"
    argv = [ctx.python, "-m", "torch.distributed.run", "--nnodes", str(world.nodes),
            "--nproc-per-node", str(world.devices), "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint,
            "--rdzv-id", world.alloc.job_id or "sprite", "-m", *cmd[2:]]
    # torchrun's workers start from a copy of the agent's environment (torch 2.13
    # distributed/elastic/multiprocessing/subprocess_handler/subprocess_handler.py:49, os.environ.copy()).
    if world.nodes == 1:
        return argv
    # One torchrun agent per node, started by the scheduler's own launcher (srun), else by the site's mpiexec in
    # its own flavour's words (Open MPI refuses PALS's --ppn, --hosts and --envall), one process a node, unbound.
    scheduler = schedulers.get(world.alloc.scheduler)
    if scheduler.own_launchers:
        return scheduler.per_node_agents(world.nodes, world.hosts, argv)
    agents = replace(world, devices=1, launcher="mpiexec", flavour=site.mpi)
    return BUILDERS[site.mpi](replace(site, cpu_bind=None, depth=None), agents, ctx, argv, env)


def _local(site, world, ctx, cmd, env):
    # sprite.launch.supervisor starts every rank with a copy of its own environment (supervisor.start_rank).
    return [ctx.python, "-m", "sprite.launch.supervisor", "--nproc", str(world.devices), "--", *cmd]


# One argv builder per contract.LAUNCHER_FLAVOURS entry: (site, world, ctx, rank command, rank env) -> argv.
BUILDERS = {"pals": _pals, "hydra": _hydra, "openmpi": _openmpi, "srun": _srun, "torchrun": _torchrun,
            "local": _local}
assert set(BUILDERS) == set(contract.LAUNCHER_FLAVOURS)
