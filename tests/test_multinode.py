"""Two nodes simulated on one machine, with real launchers (docs/scripts.md, "Several nodes on one machine").

- MPICH Hydra: a PBS allocation whose nodefile lists 127.0.0.1 and 127.0.0.2, HYDRA_LAUNCHER=fork (one proxy per
  "host", no ssh);
- Slurm: three slurmd on one machine (n1, n2, n3; NodeAddr=127.0.0.1), one cluster for the module; sprite runs
  inside ``salloc``.

Each launch is a plain torch.distributed all_reduce followed by a Lightning fit in the same world
(tests/scripts/multinode_fit.py), 2 nodes x 2 ranks, DDP and FSDP2; --exclude and --spare-nodes run on real
separate slurmd nodes. Every launch runs once per module.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import slurm_cluster
from conftest import await_warm_server, sprite_free_env

SCRIPTS = Path(__file__).resolve().parent / "scripts"
FIT, PLAIN = str(SCRIPTS / "multinode_fit.py"), str(SCRIPTS / "any_plain.py")
VENV_BIN = str(Path(sys.executable).parent)
STRIP = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "NODE_RANK", "LOCAL_WORLD_SIZE",
         "GROUP_RANK", "PBS_JOBID", "PBS_NODEFILE", "SLURM_JOB_ID", "SLURM_JOB_NODELIST", "SLURM_NODELIST",
         "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "HYDRA_LAUNCHER")
STRATEGY_CLASS = {"ddp": "XPUDDPStrategy", "fsdp": "FSDP2Strategy"}


def _env(extra: dict) -> dict:
    env = sprite_free_env(STRIP)
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"  # MPICH's mpiexec and sprite
    return {**env, **extra}


@pytest.fixture(scope="module")
def nodes(tmp_path_factory):
    """Three slurmd (n1, n2, n3) and one slurmctld on this machine, for the whole module."""
    yield from slurm_cluster.start_nodes(tmp_path_factory.mktemp("nodes"), ["n1", "n2", "n3"])


class Launches:
    def __init__(self, root: Path, sprite: list[str]) -> None:
        self.root, self.sprite, self.done = root, sprite, {}

    def _run(self, key, cmd_prefix: list[str], flags: list[str], script: str, env: dict, args=()):
        if key not in self.done:
            folder = self.root / "-".join(key)
            folder.mkdir()
            cmd = [*cmd_prefix, *self.sprite, "run", "--run-dir", str(folder / "run"), *flags, script, str(folder),
                   *args]
            proc = subprocess.run(cmd, cwd=folder, env=env, capture_output=True, text=True, timeout=420)
            self.done[key] = (proc, folder)
        return self.done[key]

    def hydra(self, strategy: str):
        nodefile = self.root / "nodefile"
        nodefile.write_text("127.0.0.1\n127.0.0.2\n")
        env = _env({"PBS_JOBID": "4242.sim", "PBS_NODEFILE": str(nodefile), "HYDRA_LAUNCHER": "fork"})
        flags = ["--launcher", "mpiexec", "--mpi", "hydra", "--nodes", "2", "--devices", "2", "--strategy", strategy]
        return self._run(("hydra", strategy), [], flags, FIT, env)

    def torchrun_under_hydra(self):
        """One torchrun agent a simulated node, started by Hydra's mpiexec (the PBS path without a launcher of
        its own), two ranks each."""
        nodefile = self.root / "nodefile-torchrun"
        nodefile.write_text("127.0.0.1\n127.0.0.2\n")
        env = _env({"PBS_JOBID": "4243.sim", "PBS_NODEFILE": str(nodefile), "HYDRA_LAUNCHER": "fork"})
        flags = ["--launcher", "torchrun", "--nodes", "2", "--devices", "2", "--strategy", "ddp"]
        return self._run(("torchrun", "hydra"), [], flags, FIT, env)

    def srun(self, name: str, cluster, alloc_nodes: int, flags: list[str], script: str = FIT, args=()):
        salloc = ["salloc", "-N", str(alloc_nodes), "--ntasks-per-node=2", "--quiet"]
        flags = ["--launcher", "srun", "--devices", "2", *flags]
        return self._run(("srun", name), salloc, flags, script, _env({"SLURM_CONF": cluster.env["SLURM_CONF"]}),
                         args)


@pytest.fixture(scope="module")
def launches(tmp_path_factory, sprite_cmd):
    return Launches(tmp_path_factory.mktemp("multinode"), sprite_cmd)


def _records(folder: Path, prefix: str, count: int) -> list[dict]:
    return [json.loads((folder / f"{prefix}{rank}.json").read_text()) for rank in range(count)]


def _check_two_nodes(proc, folder: Path, strategy: str) -> list[dict]:
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    seen = _records(folder, "node", 4)
    assert [(s["NODE_RANK"], s["GROUP_RANK"], s["LOCAL_RANK"], s["RANK"]) for s in seen] == [
        ("0", "0", "0", "0"), ("0", "0", "1", "1"), ("1", "1", "0", "2"), ("1", "1", "1", "3")]
    assert [(s["node_rank"], s["local_rank"]) for s in seen] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert {(s["WORLD_SIZE"], s["LOCAL_WORLD_SIZE"], s["sum"], s["num_nodes"], s["world"]) for s in seen} == {
        ("4", "2", 10.0, 2, 4)}  # the plain all_reduce: 1 + 2 + 3 + 4
    assert {s["strategy"] for s in seen} == {STRATEGY_CLASS[strategy]}
    assert len({s["digest"] for s in seen}) == 1  # one model on every rank of both nodes
    assert {s["MASTER_ADDR"] for s in seen} == {"127.0.0.1"}
    return seen


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_hydra_nodes_on_loopback_addresses(launches, strategy):
    _check_two_nodes(*launches.hydra(strategy), strategy)


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_slurmd_nodes_under_srun(launches, nodes, strategy):
    _check_two_nodes(*launches.srun(strategy, nodes, 2, ["--nodes", "2", "--strategy", strategy]), strategy)


def test_exclude_leaves_out_one_of_three_slurmd_nodes(launches, nodes):
    proc, folder = launches.srun("exclude", nodes, 3, ["--exclude", "n1"], PLAIN)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    seen = [json.loads((folder / f"plain{rank}.json").read_text()) for rank in range(4)]
    assert [s["SLURMD_NODENAME"] for s in seen] == ["n2", "n2", "n3", "n3"]
    assert {(s["sum"], s["world"]) for s in seen} == {(10.0, 4)}


def test_a_spare_slurmd_node_replaces_a_failed_one(launches, nodes):
    flags = ["--spare-nodes", "1", "--retries", "1"]
    proc, folder = launches.srun("spare", nodes, 3, flags, PLAIN, ["--kill-on", "n2"])
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    seen = [json.loads((folder / f"plain{rank}.json").read_text()) for rank in range(4)]
    assert [s["SLURMD_NODENAME"] for s in seen] == ["n1", "n1", "n3", "n3"]  # n2 failed; the spare n3 took over
    assert {(s["sum"], s["world"]) for s in seen} == {(10.0, 4)}
    audit = [json.loads(line) for line in (folder / "run" / "audit.jsonl").read_text().splitlines()]
    starts = [entry.get("hosts") for entry in audit if entry.get("event", entry.get("kind")) == "attempt_start"]
    assert starts == [["n1", "n2"], ["n1", "n3"]], audit


def test_plain_torch_distributed_script_under_srun_on_one_node(launches, nodes):
    served = await_warm_server()
    proc, folder = launches.srun("plain", nodes, 1, ["--nodes", "1"], PLAIN)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    seen = [json.loads((folder / f"plain{rank}.json").read_text()) for rank in range(2)]
    assert [(s["RANK"], s["LOCAL_RANK"], s["NODE_RANK"], s["sum"]) for s in seen] == [("0", "0", "0", 3.0),
                                                                                     ("1", "1", "0", 3.0)]
    assert {(s["WORLD_SIZE"], s["LOCAL_WORLD_SIZE"], s["MASTER_ADDR"]) for s in seen} == {("2", "2", "127.0.0.1")}
    assert [s["warm_served"] for s in seen] == [served, served]  # srun's tasks hand their ranks to the server


def test_a_whole_node_asked_for_no_tasks_plans_the_sites_ranks_not_its_cpus(nodes, sprite_cmd, tmp_path):
    """Real slurmd: inside ``salloc -N 2 --exclusive`` (no task count) Slurm fills SLURM_TASKS_PER_NODE from the
    CPUs it allocated; sprite took that for ranks per node. A spec asking -n 4 still gets its tasks a node."""
    env = _env({"SLURM_CONF": nodes.env["SLURM_CONF"]})

    def planned(*salloc: str) -> dict:
        done = subprocess.run(["salloc", *salloc, "--quiet", *sprite_cmd, "run", "--accelerator", "cpu", "--dry-run",
                               "--json", FIT], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)["env"]

    whole = planned("-N", "2", "--exclusive")
    assert whole["SPRITE_DEVICES"] == "1" and whole["WORLD_SIZE"] == "2", whole  # local site: 1 a node, not the CPUs
    asked = planned("-N", "2", "-n", "4")
    assert asked["SPRITE_DEVICES"] == "2" and asked["WORLD_SIZE"] == "4", asked


def test_torchrun_agents_started_by_mpiexec_on_two_simulated_nodes(launches):
    """--launcher torchrun over two Hydra nodes on loopback addresses: mpiexec starts one torchrun agent a node
    (79b3429), the agents meet at the first host and their four ranks train one DDP model. The agent's MPICH
    variables reach the ranks: MPI_LOCALNRANKS=1 (one agent a node) was read as the ranks per node and every rank
    refused to start."""
    proc, folder = launches.torchrun_under_hydra()
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    seen = _records(folder, "node", 4)
    assert [s["RANK"] for s in seen] == ["0", "1", "2", "3"]
    by_node = {}
    for s in seen:
        by_node.setdefault(s["GROUP_RANK"], []).append(s["LOCAL_RANK"])
    assert sorted(by_node) == ["0", "1"] and all(sorted(v) == ["0", "1"] for v in by_node.values())
    assert {(s["WORLD_SIZE"], s["LOCAL_WORLD_SIZE"], s["sum"], s["num_nodes"], s["world"]) for s in seen} == {
        ("4", "2", 10.0, 2, 4)}
    assert {s["strategy"] for s in seen} == {STRATEGY_CLASS["ddp"]} and len({s["digest"] for s in seen}) == 1
