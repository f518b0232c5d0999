"""A real single-node Slurm for tests: slurmctld + slurmd started in a temp dir, stopped by their PIDs.

Uses the slurm.conf of shared/FACTS.md (auth/none, no munge, no accounting). ``sacct`` does not work with
accounting off, so job states come from ``scontrol show job`` while MinJobAge keeps the record.
Import it from a test module and use the ``slurm`` fixture; it skips only when slurmctld is not installed.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from sprite.launch import rendezvous

CONF = """\
ClusterName=local
SlurmctldHost={host}
SlurmctldPort={ctld_port}
FirstJobId={first_job}
SlurmdPort={d_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/none
CredType=cred/none
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd.log
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
SchedulerType=sched/backfill
InactiveLimit=0
KillWait=5
MinJobAge=300
NodeName={host} CPUs={cpus} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""
APT_HINT = "apt-get install -y slurm-wlm slurm-wlm-torque"


def _conf(**fields) -> str:
    """CONF with the job ids of this cluster starting at 1,000 x its slurmctld port: every cluster running at once
    on this machine (one per xdist worker, plus the multi-node ones) then numbers its jobs apart. Each numbering
    from 1 gave two concurrent jobs the id 1, so sprite derived one rendezvous port for both (a hash of the job id,
    sprite.launch.rendezvous) and their ranks met in one TCPStore: a CI run failed a Slurm job and a preflight so."""
    return CONF.format(first_job=fields["ctld_port"] * 1000, **fields)


@dataclass
class SlurmCluster:
    """A running cluster: ``env`` has SLURM_CONF and PATH for client commands."""

    dir: Path
    env: dict

    def job(self, job_id: str) -> dict:
        """``scontrol show job`` as a dict ({} once the record is gone)."""
        out = subprocess.run(["scontrol", "-o", "show", "job", job_id], env=self.env, capture_output=True,
                             text=True).stdout
        return dict(re.findall(r"(\w+)=(\S*)", out))

    def wait_state(self, job_id: str, states: tuple[str, ...], timeout: float = 120) -> dict:
        """Poll until the job's JobState is one of ``states``; fail the test with its record on timeout."""
        deadline = time.monotonic() + timeout
        info = {}
        while time.monotonic() < deadline:
            info = self.job(job_id)
            if info.get("JobState") in states:
                return info
            time.sleep(0.5)
        pytest.fail(f"job {job_id} did not reach {states} in {timeout}s: {info}")


def _wait_idle(env: dict, host: str, procs: list, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(p.poll() is not None for p in procs):
            raise RuntimeError("a Slurm daemon exited at start; see its log in the cluster dir")
        out = subprocess.run(["sinfo", "-h", "-n", host, "-o", "%T"], env=env, capture_output=True, text=True)
        if out.stdout.strip().rstrip("*") in ("idle", "mixed"):
            return
        time.sleep(0.3)
    raise RuntimeError(f"the Slurm node {host} did not become idle in {timeout}s")


def _stop(procs: list) -> None:
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)  # setsid gave each daemon its own group: ours only
    for proc in procs:
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


_given: set[int] = set()


def _free_port() -> int:
    """slurmctld and each slurmd listen seconds after this: a port outside the kernel's ephemeral range, which no
    other process is handed meanwhile, and not one given to a daemon of this session before (none listens yet)."""
    port = rendezvous.free_port()
    while port in _given:
        port = rendezvous.free_port()
    _given.add(port)
    return port


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    """Start slurmctld and slurmd (foreground, own session) for the test session; stop them by PID after."""
    if not shutil.which("slurmctld") or not shutil.which("slurmd"):
        pytest.skip(f"slurmctld/slurmd are not installed (CI: {APT_HINT})")
    base = tmp_path_factory.mktemp("slurm")
    host = socket.gethostname().split(".")[0]
    for sub in ("state", "spool"):
        (base / sub).mkdir()
    conf = base / "slurm.conf"
    # Ports of our own: another test session's cluster on this machine holds the defaults (6817, 6818).
    conf.write_text(_conf(host=host, dir=base, cpus=max(2, os.cpu_count() or 2), ctld_port=_free_port(),
                          d_port=_free_port()))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    procs = [subprocess.Popen([daemon, "-D", "-f", str(conf)], env=env, start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=(base / f"{daemon}.stderr").open("wb"))
             for daemon in ("slurmctld", "slurmd")]
    try:
        _wait_idle(env, host, procs)
        yield SlurmCluster(base, env)
    finally:
        _stop(procs)


# --- several slurmd on one machine (shared/FACTS.md "Several nodes on one machine") -----------------------------

MULTI_NODE = "NodeName={name} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} CPUs={cpus} State=UNKNOWN\n"


def _multi_conf(base: Path, host: str, names: list[str]) -> str:
    """The single-node slurm.conf with one NodeName line per simulated node: each slurmd has its own port,
    spool, PID and log file (%n is the node name), and every NodeAddr is this machine's loopback."""
    single = _conf(host=host, dir=base, cpus=2, ctld_port=_free_port(), d_port=_free_port())
    lines = [line for line in single.splitlines(keepends=True) if not line.startswith(("NodeName=", "SlurmdPort="))]
    text = "".join(lines).replace(f"{base}/spool\n", f"{base}/spool/%n\n")
    text = text.replace(f"{base}/slurmd.pid", f"{base}/slurmd.%n.pid").replace(f"{base}/slurmd.log",
                                                                                f"{base}/slurmd.%n.log")
    cpus = max(2, os.cpu_count() or 2)
    nodes = "".join(MULTI_NODE.format(name=name, host=host, port=_free_port(), cpus=cpus) for name in names)
    return text.replace("PartitionName=", nodes + "PartitionName=")


def start_nodes(base: Path, names: list[str]):
    """Start slurmctld and one ``slurmd -N NAME`` per name; a generator fixture body: yields a SlurmCluster.

    The node names do not resolve (every NodeAddr is 127.0.0.1): sprite takes the rendezvous address from the
    node's NodeAddr (sprite/runtime/standard_env.py), so no /etc/hosts entry is needed.
    """
    if not shutil.which("slurmctld") or not shutil.which("slurmd"):
        pytest.skip(f"slurmctld/slurmd are not installed (CI: {APT_HINT})")
    host = socket.gethostname().split(".")[0]
    (base / "state").mkdir()
    for name in names:
        (base / "spool" / name).mkdir(parents=True)
    conf = base / "slurm.conf"
    conf.write_text(_multi_conf(base, host, names))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    procs = [subprocess.Popen(["slurmctld", "-D", "-f", str(conf)], env=env, start_new_session=True,
                              stdout=subprocess.DEVNULL, stderr=(base / "slurmctld.stderr").open("wb"))]
    procs += [subprocess.Popen(["slurmd", "-D", "-N", name, "-f", str(conf)], env=env, start_new_session=True,
                               stdout=subprocess.DEVNULL, stderr=(base / f"slurmd.{name}.stderr").open("wb"))
              for name in names]
    try:
        for name in names:
            _wait_idle(env, name, procs)
        yield SlurmCluster(base, env)
    finally:
        _stop(procs)
