"""Launch plans under faked PBS and Slurm allocations (planning only: nothing is started)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest

from sprite import contract
from sprite.launch import rendezvous
from sprite.launch.plan import plan_run
from sprite.errors import UsageError

from conftest import OUTSIDE_CHECKOUT

AURORA_HOSTS = ["x4000c0s0b0n0", "x4000c0s1b0n0"]
PBS_JOB = "8505298.aurora-pbsadmin-0001"


@pytest.fixture
def pbs_env(clean_env, tmp_path):
    nodefile = tmp_path / "nodefile"
    # PBS writes one line per host (select=N); repeated lines must collapse, order must stay.
    nodefile.write_text("\n".join([AURORA_HOSTS[0], AURORA_HOSTS[1], AURORA_HOSTS[1]]) + "\n")
    return {**clean_env, "PBS_JOBID": PBS_JOB, "PBS_NODEFILE": str(nodefile)}


@pytest.fixture
def slurm_env(clean_env):
    return {**clean_env, "SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "nid[001-002]",
            "SLURM_NTASKS_PER_NODE": "4"}


def test_aurora_fsdp_plan_through_cli(pbs_env, sprite_cmd, example_script):
    out = subprocess.run([*sprite_cmd, "run", "--site", "aurora", "--nodes", "2", "--strategy", "fsdp",
                          "--dry-run", "--json", example_script, "--max-steps", "3"],
                         env=pbs_env, capture_output=True, text=True, check=True)
    plan = json.loads(out.stdout)
    assert set(plan) == {"argv", "env"}
    argv, env = plan["argv"], plan["env"]
    assert argv[:7] == ["mpiexec", "--label", "--line-buffer", "-n", "24", "--ppn", "12"]
    assert argv[argv.index("--cpu-bind") + 1].startswith("list:4-7:8-11:")
    assert "--envall" in argv and "--hosts" not in argv  # whole allocation: PALS takes it from PBS
    assert argv[-5:] == ["-m", "sprite.runtime", example_script, "--max-steps", "3"]
    assert env["ZE_FLAT_DEVICE_HIERARCHY"] == "FLAT"
    assert env["MASTER_ADDR"] == AURORA_HOSTS[0] + ".hsn.cm.aurora.alcf.anl.gov"  # the high-speed network
    assert env["SPRITE_CONSOLE_RANKS"] == "0"  # 24 ranks: only rank 0 on the console by default
    assert env["MASTER_PORT"] == str(rendezvous.port_from_job_id(PBS_JOB))
    assert env["WORLD_SIZE"] == env[contract.WORLD_SIZE] == "24"
    assert env[contract.STRATEGY] == "fsdp" and env[contract.LAUNCHER] == "pals"
    assert env[contract.HOSTS] == ",".join(AURORA_HOSTS)


def test_slurm_plan_uses_srun_and_allocation_tasks(slurm_env, example_script):
    plan = plan_run({"script": example_script, "site": "perlmutter", "strategy": "ddp"}, slurm_env)
    argv = plan.argv
    assert argv[:8] == ["srun", "--label", "--nodes", "2", "--ntasks", "8", "--ntasks-per-node", "4"]
    assert "--kill-on-bad-exit=1" in argv and "--nodelist" not in argv
    assert plan.env["MASTER_ADDR"] == "nid001"
    assert plan.env["MASTER_PORT"] == str(rendezvous.port_from_job_id("4242"))
    assert plan.env["WORLD_SIZE"] == "8"
    # A relaunch takes a port of its own: a process of the attempt before may still hold the first one.
    again = plan_run({"script": example_script, "site": "perlmutter", "strategy": "ddp"}, slurm_env,
                     run_env={"SPRITE_ATTEMPT": "2"})
    assert again.env["MASTER_PORT"] != plan.env["MASTER_PORT"]
    assert again.env["MASTER_PORT"] == str(rendezvous.port_from_job_id("4242/attempt-2"))
    first = plan_run({"script": example_script, "site": "perlmutter", "strategy": "ddp"}, slurm_env,
                     run_env={"SPRITE_ATTEMPT": "1"})
    assert first.env["MASTER_PORT"] == plan.env["MASTER_PORT"]


@pytest.mark.parametrize("tasks, devices", [
    ({"SLURM_TASKS_PER_NODE": "128(x2)"}, 4),  # a whole node asked for no tasks: Slurm counts its CPUs
    ({"SLURM_TASKS_PER_NODE": "2(x2)", "SLURM_NTASKS": "4"}, 2),  # -n 4: the tasks Slurm gave each node
    ({"SLURM_TASKS_PER_NODE": "3,1", "SLURM_NTASKS": "4"}, 1),  # uneven: the fewest any node got
    ({"SLURM_NTASKS_PER_NODE": "2", "SLURM_TASKS_PER_NODE": "128(x2)"}, 2),
])
def test_slurms_tasks_per_node_count_only_when_the_job_asked_for_tasks(clean_env, example_script, tasks, devices):
    """Without a task count Slurm fills SLURM_TASKS_PER_NODE from the CPUs it allocated: that planned 128 ranks a
    node (and a shared node 1) instead of the site's 4 GPUs."""
    env = {**clean_env, "SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "nid[001-002]", **tasks}
    plan = plan_run({"script": example_script, "site": "perlmutter"}, env)
    assert plan.world.devices == devices and plan.env["WORLD_SIZE"] == str(2 * devices)


def test_exclude_matches_a_node_files_full_names_by_their_short_name(clean_env, example_script, tmp_path):
    """Aurora's node file holds full names (x4000c0s0b0n0.hostmgmt2000.cm.aurora.alcf.anl.gov); --exclude with the
    short name (as a user, or a heartbeat's gethostname, writes it) was refused as a host of another job. The
    plan keeps the node file's spelling; a host of no allocation is still refused."""
    from sprite.errors import UsageError

    full = [f"x4000c0s{n}b0n0.hostmgmt2000.cm.aurora.alcf.anl.gov" for n in range(3)]
    nodes = tmp_path / "nodes"
    nodes.write_text("\n".join(full) + "\n")
    env = {**clean_env, "PBS_JOBID": "8.aurora", "PBS_NODEFILE": str(nodes)}
    plan = plan_run({"script": example_script, "site": "aurora", "exclude": ["x4000c0s0b0n0"]}, env)
    assert plan.world.hosts == tuple(full[1:])
    nodes.write_text("x4000c0s0b0n0\nx4000c0s1b0n0\n")  # and the other way round
    plan = plan_run({"script": example_script, "site": "aurora", "exclude": [full[1]]}, env)
    assert plan.world.hosts == ("x4000c0s0b0n0",)
    with pytest.raises(UsageError, match="names 'x9999c0s0b0n0'|names x9999c0s0b0n0"):
        plan_run({"script": example_script, "site": "aurora", "exclude": ["x9999c0s0b0n0"]}, env)


def test_a_host_list_over_linuxs_limit_for_one_variable_is_planned_with_a_note_and_never_started(
        clean_env, example_script, tmp_path, sprite_cmd):
    """3,000 hosts with Aurora's 50-character node-file names make SPRITE_HOSTS 150 KB, over the 131,072 bytes
    execve takes for one string: the launch failed with E2BIG, reported as a full disk (exit 1). The dry run now
    says the plan cannot be started, and the run refuses it in one line, exit 2, before any launcher starts."""
    import subprocess

    nodes = tmp_path / "nodes"
    nodes.write_text("".join(f"x{4000 + i // 64}c{i // 16 % 4}s{i // 2 % 8}b0n{i % 2}.hostmgmt{2000 + i // 64}.cm."
                             f"aurora.alcf.anl.gov\n" for i in range(3000)))
    env = {**clean_env, "PBS_JOBID": "9.aurora", "PBS_NODEFILE": str(nodes)}
    plan = plan_run({"script": example_script, "site": "aurora"}, env)
    assert any(note.startswith("this plan cannot be started: the variable SPRITE_HOSTS is 150,") for note in plan.notes)
    done = subprocess.run([*sprite_cmd, "run", "--site", "local", "--launcher", "mpiexec",
                           "--accelerator", "cpu", "--devices", "1", "--run-dir", str(tmp_path / "run"),
                           example_script], env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    said = [line for line in done.stderr.splitlines() if line.startswith("sprite: error:")]
    assert done.returncode == 2 and len(said) == 1, done.stderr
    assert said[0].startswith("sprite: error: The launch cannot be started: an argument of the launch is 149,")
    small = nodes.read_text().splitlines()[:2000]  # 2,000 such hosts fit
    nodes.write_text("\n".join(small) + "\n")
    assert not [n for n in plan_run({"script": example_script, "site": "aurora"}, env).notes if "cannot" in n]


def test_slurm_multi_group_nodelist_keeps_order(clean_env, example_script):
    env = {**clean_env, "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "nid[001-003,007],gpu-[1-2]"}
    plan = plan_run({"script": example_script, "site": "perlmutter", "devices": 1}, env)
    assert plan.env[contract.HOSTS] == "nid001,nid002,nid003,nid007,gpu-1,gpu-2"
    assert plan.world.size == 6


def test_exclude_and_fewer_nodes_name_hosts(pbs_env, tmp_path, example_script):
    nodefile = tmp_path / "three"
    nodefile.write_text("a1\na2\na3\n")
    env = {**pbs_env, "PBS_NODEFILE": str(nodefile)}
    plan = plan_run({"script": example_script, "site": "aurora", "exclude": ["a2"]}, env)
    assert plan.argv[plan.argv.index("--hosts") + 1] == "a1,a3"
    assert plan.argv[plan.argv.index("-n") + 1] == "24"
    plan = plan_run({"script": example_script, "site": "aurora", "nodes": 1}, env)
    assert plan.argv[plan.argv.index("--hosts") + 1] == "a1" and plan.env["WORLD_SIZE"] == "12"


def test_port_precedence_and_range(pbs_env, example_script):
    derived = plan_run({"script": example_script, "site": "aurora"}, pbs_env).env["MASTER_PORT"]
    assert rendezvous.PORT_BASE <= int(derived) < rendezvous.PORT_BASE + rendezvous.PORT_SPAN
    assert plan_run({"script": example_script, "site": "aurora", "master_port": "31000"},
                    {**pbs_env, "MASTER_PORT": "23456"}).env["MASTER_PORT"] == "31000"


def test_inherited_rendezvous_is_replaced_with_a_note(pbs_env, tmp_path, example_script):
    """sprite owns MASTER_ADDR/MASTER_PORT: stale values from the caller never steer the ranks, least of all
    towards a host left out with --exclude."""
    nodefile = tmp_path / "three"
    nodefile.write_text("a1\na2\na3\n")
    env = {**pbs_env, "PBS_NODEFILE": str(nodefile), "MASTER_ADDR": "a1", "MASTER_PORT": "23456"}
    plan = plan_run({"script": example_script, "site": "aurora", "exclude": ["a1"]}, env)
    hsn = ".hsn.cm.aurora.alcf.anl.gov"  # Aurora's profile: the rendezvous runs over the high-speed network
    assert plan.env["MASTER_ADDR"] == "a2" + hsn and plan.env["MASTER_PORT"] != "23456"
    assert [note.split("=")[0] for note in plan.notes] == ["note: MASTER_ADDR", "note: MASTER_PORT"]
    assert f"replaced by a2{hsn}" in plan.notes[0] and "--master-port" in plan.notes[1]
    quiet = plan_run({"script": example_script, "site": "aurora"},
                     {**pbs_env, "MASTER_ADDR": AURORA_HOSTS[0] + hsn})
    assert quiet.notes == ()  # the same value: nothing to say


def test_derived_port_is_the_same_in_another_process():
    # Python's hash() is salted per process; the derivation must not be.
    code = "from sprite.launch.rendezvous import port_from_job_id as p; print(p('123.pbs'))"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           cwd=OUTSIDE_CHECKOUT)
    assert int(other.stdout) == rendezvous.port_from_job_id("123.pbs")
    assert rendezvous.port_from_job_id("123.pbs") != rendezvous.port_from_job_id("124.pbs")


def _listening(port: int = 0) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("", port))
    sock.listen()
    return sock


def test_a_taken_rendezvous_port_on_this_host_is_refused_before_launch():
    """Two jobs on one node can derive the same port: rank 0 would fail with EADDRINUSE while its peers join
    the other job's store. Only a live listener on this machine counts; rank 0 elsewhere cannot be checked."""
    with _listening() as holder:
        port = str(holder.getsockname()[1])
        here = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "WORLD_SIZE": "2"}
        with pytest.raises(UsageError, match=f"port {port} on 127.0.0.1 is already in use") as err:
            rendezvous.check_free(here)
        assert "--master-port" in err.value.fix
        with pytest.raises(UsageError):  # this host under its own name, short or long
            rendezvous.check_free({**here, "MASTER_ADDR": "nid001.hsn.example"}, hostname="nid001")
        rendezvous.check_free({**here, "MASTER_ADDR": "nid002"}, hostname="nid001")  # rank 0 is not here
        rendezvous.check_free({**here, "WORLD_SIZE": "1"})  # one rank: no process group, nothing listens
    rendezvous.check_free(here)  # closed: free again


def test_sprite_run_stops_with_exit_2_when_the_derived_port_is_taken(clean_env, sprite_cmd, example_script,
                                                                       tmp_path):
    job = "4242"
    env = {**clean_env, "SLURM_JOB_ID": job, "SLURM_JOB_NODELIST": socket.gethostname().split(".")[0]}
    port = rendezvous.port_from_job_id(job)
    try:
        holder = _listening(port)
    except OSError:
        pytest.skip(f"port {port} is in use on this machine already")
    run_dir = tmp_path / "run"
    with holder:
        out = subprocess.run([*sprite_cmd, "run", "--launcher", "local", "--devices", "2", "--run-dir",
                              str(run_dir), example_script], env=env, capture_output=True, text=True,
                             cwd=OUTSIDE_CHECKOUT, timeout=120)
    assert out.returncode == 2, out.stderr
    assert f"rendezvous port {port} on 127.0.0.1 is already in use" in out.stderr
    assert "--master-port" in out.stderr and "Traceback" not in out.stderr
    assert not run_dir.exists()  # refused before anything was created


def test_local_plan_uses_supervisor_and_loopback(clean_env, example_script):
    plan = plan_run({"script": example_script, "devices": 2}, clean_env)
    assert plan.argv[1:5] == ["-m", "sprite.launch.supervisor", "--nproc", "2"]
    assert plan.env["MASTER_ADDR"] == "127.0.0.1" and plan.env["WORLD_SIZE"] == "2"
    assert 1024 <= int(plan.env["MASTER_PORT"]) <= 65535


def test_flags_override_the_spec(clean_env, example_script, tmp_path):
    """docs/run.md: --spec FILE, flags override it (key by key; the spec's other keys stay)."""
    spec = tmp_path / "job.yaml"
    spec.write_text(f"script: {example_script}\ndevices: 2\nstrategy: ddp\nprecision: bf16-mixed\n")
    from_spec = plan_run({}, clean_env, spec_file=str(spec))
    assert from_spec.env["WORLD_SIZE"] == "2" and from_spec.env[contract.STRATEGY] == "ddp"
    plan = plan_run({"devices": "1", "strategy": "auto"}, clean_env, spec_file=str(spec))
    assert plan.env["WORLD_SIZE"] == "1" and plan.env[contract.STRATEGY] == "auto"
    assert plan.env[contract.PRECISION] == "bf16-mixed"


def test_other_flavours(clean_env, slurm_env, example_script):
    hydra = plan_run({"script": example_script, "devices": 2, "launcher": "mpiexec"}, clean_env)
    assert hydra.argv[:6] == ["mpiexec", "-prepend-rank", "-n", "2", "-ppn", "2"]
    assert hydra.env[contract.LAUNCHER] == "hydra"
    ompi = plan_run({"script": example_script, "devices": 2, "launcher": "mpiexec", "mpi": "openmpi"},
                           clean_env)
    exported = {ompi.argv[i + 1] for i, arg in enumerate(ompi.argv) if arg == "-x"}
    assert exported == set(ompi.env)  # Open MPI forwards only what -x names
    torchrun = plan_run({"script": example_script, "devices": 2, "launcher": "torchrun"}, clean_env)
    assert torchrun.argv[1:3] == ["-m", "torch.distributed.run"] and "--nproc-per-node" in torchrun.argv
    multi = plan_run({"script": example_script, "site": "perlmutter", "launcher": "torchrun"}, slurm_env)
    assert multi.argv[:2] == ["srun", "--nodes"] and multi.argv[multi.argv.index("--nnodes") + 1] == "2"


def test_torchruns_agents_under_pbs_are_started_in_the_sites_mpiexec_flavour(pbs_env, example_script, tmp_path):
    """One torchrun agent a node under PBS was always started with PALS's words (--ppn, --hosts, --envall), which
    Open MPI's mpirun refuses; each flavour now gets its own, one unbound process a node."""
    agents = {}
    for mpi in ("pals", "hydra", "openmpi"):
        site = tmp_path / f"{mpi}.yaml"
        site.write_text(f"name: {mpi}\nscheduler: pbs\nmpi: {mpi}\ncpu_bind: depth\njob: {{devices: 4}}\n")
        argv = plan_run({"script": example_script, "site": str(site), "launcher": "torchrun"}, pbs_env).argv
        agents[mpi] = argv[:argv.index("-m")]
    assert agents["pals"][:5] == ["mpiexec", "-n", "2", "--ppn", "1"] and "--envall" in agents["pals"]
    assert agents["hydra"][:5] == ["mpiexec", "-n", "2", "-ppn", "1"] and "--envall" not in agents["hydra"]
    assert agents["openmpi"][:5] == ["mpirun", "-n", "2", "--map-by", "ppr:1:node"]
    assert "--ppn" not in agents["openmpi"] and "-x" in agents["openmpi"] and "MASTER_PORT" in agents["openmpi"]
    assert not any("--cpu-bind" in a for argv in agents.values() for a in argv)  # the ranks' binding, not agents'


def test_torchruns_endpoint_over_several_nodes_is_the_node_files_name_not_the_high_speed_alias(pbs_env,
                                                                                              example_script):
    """torch's c10d rendezvous starts its store only on the agent whose hostname matches the endpoint; Aurora's
    MASTER_ADDR is the .hsn alias, which matches no agent, so the endpoint is the first host as PBS names it."""
    plan = plan_run({"script": example_script, "site": "aurora", "launcher": "torchrun"}, pbs_env)
    endpoint = plan.argv[plan.argv.index("--rdzv-endpoint") + 1]
    assert endpoint == f"{AURORA_HOSTS[0]}:{plan.env['MASTER_PORT']}"
    assert plan.env["MASTER_ADDR"] == AURORA_HOSTS[0] + ".hsn.cm.aurora.alcf.anl.gov"


@pytest.mark.parametrize("flags, message", [
    ({"nodes": 3}, "--nodes 3 asks for more nodes than the SLURM allocation 4242 has (2"),
    ({"devices": 8}, "grants (4 tasks a node: SLURM_NTASKS_PER_NODE"),
    ({"strategy": "single"}, "--strategy single runs one rank"),
    ({"launcher": "local", "nodes": 2}, "--launcher local starts ranks on this machine only"),
    ({"exclude": ["nid009"]}, "not in the allocation"),
])
def test_requests_the_allocation_cannot_hold(slurm_env, example_script, flags, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(")):
        plan_run({"script": example_script, "site": "perlmutter", **flags}, slurm_env)


def test_several_nodes_outside_any_job_name_the_missing_allocation(clean_env, example_script):
    """The headline `sprite run --nodes 2 --strategy fsdp train.py` typed on a login node or a laptop: the message
    says there is no job here and how to get one, not that a job was granted too few nodes."""
    with pytest.raises(UsageError) as refused:
        plan_run({"script": example_script, "nodes": 2, "strategy": "fsdp"}, clean_env)
    text = str(refused.value)
    assert text.startswith("--nodes 2 asks for 2 nodes, but no PBS or Slurm job runs here (PBS_JOBID and "
                           "SLURM_JOB_ID are unset), so sprite sees this machine alone")
    assert "Run it inside a 2-node job (qsub -I, salloc), submit it with `sprite qsub JOB.yaml` (nodes: 2)" in text
    assert "granted" not in text


def test_a_local_run_draws_its_port_outside_the_kernels_range_and_skips_a_taken_one():
    """A port the kernel handed out (``bind(0)``) can go to another process's connection or gloo listener before
    rank 0 listens on it; a relaunched attempt failed so with EADDRINUSE. sprite draws from its own span, below
    the ephemeral range, and passes over a port a live listener holds."""
    low, high = rendezvous.ephemeral_range()
    drawn = rendezvous.free_port()
    assert rendezvous.PORT_BASE <= drawn < rendezvous.PORT_BASE + rendezvous.PORT_SPAN
    assert not low <= drawn <= high
    with _listening(drawn) as holder:
        port = holder.getsockname()[1]
        in_kernel_range = rendezvous.PORT_BASE + 5
        kernel = (in_kernel_range, in_kernel_range)
        assert rendezvous.free_port(lambda span, n: [port, in_kernel_range, port + 1], kernel) == port + 1
    # every draw taken or inside the kernel's range: the kernel chooses, as before
    assert rendezvous.free_port(lambda span, n: [], kernel) > 0


def test_the_ephemeral_range_falls_back_to_linuxs_default(tmp_path):
    (tmp_path / "range").write_text("40000\t50000\n")
    assert rendezvous.ephemeral_range(str(tmp_path / "range")) == (40000, 50000)
    (tmp_path / "bad").write_text("forty\n")
    assert rendezvous.ephemeral_range(str(tmp_path / "bad")) == rendezvous.EPHEMERAL_DEFAULT
    assert rendezvous.ephemeral_range(str(tmp_path / "missing")) == rendezvous.EPHEMERAL_DEFAULT


def test_polaris_runs_pals_mpiexec_with_four_ranks_a_node(pbs_env, example_script):
    """README and docs/run.md: PALS mpiexec on Aurora and Polaris; Polaris's profile gives 4 ranks a node."""
    plan = plan_run({"script": example_script, "site": "polaris"}, pbs_env)
    assert plan.argv[:11] == ["mpiexec", "--label", "--line-buffer", "-n", "8", "--ppn", "4", "--cpu-bind", "depth",
                              "--depth", "8"]  # PALS's options; Hydra's would be -ppn and -hosts
    assert "-hosts" not in plan.argv and plan.env["WORLD_SIZE"] == "8"
