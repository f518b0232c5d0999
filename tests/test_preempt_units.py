"""Preemption without Lightning fits: the signal each launcher passes on, the plan's contract variable, the ranks'
handler, how an attempt that stopped for preemption is classified, what the job scripts say, and the requeue
commands (Slurm's run against a FAKE scontrol, PBS's against a FAKE qsub: the real ones run in
tests/test_preempt_runs.py for Slurm; PBS Pro does not exist here)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sprite import contract
from sprite.integrity import audit
from sprite.contract import heartbeat
from sprite.launch import plan
from sprite.contract import preemption
from sprite.jobs import submit
from sprite.errors import EXIT_PREEMPTED, UsageError
from sprite.contract.heartbeat import Beat
from sprite.recovery import attempt, classify, requeue
from sprite.recovery.classify import PREEMPTION
from sprite.runtime import preempt_signal
from sprite.schedulers import pbs, slurm
from sprite.schedulers.local import NoScheduler

SLURM = {"SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "nid001", "SLURM_NTASKS_PER_NODE": "2"}


@pytest.fixture
def script(tmp_path) -> str:
    path = tmp_path / "train.py"
    path.write_text("print('hi')\n")
    return str(path)


def test_each_launcher_is_refused_a_signal_it_would_not_pass_on_when_chosen_explicitly():
    preemption.check_launcher(None, "torchrun")  # the default stays: the scheduler may signal the ranks directly
    preemption.check_launcher("USR2", "srun")
    preemption.check_launcher("USR1", "hydra")
    with pytest.raises(UsageError, match="hydra launcher does not pass SIGUSR2.*--preempt-signal USR1"):
        preemption.check_launcher("USR2", "hydra")
    with pytest.raises(UsageError, match="torchrun launcher does not pass SIGUSR1.*--preempt-signal none"):
        preemption.check_launcher("USR1", "torchrun")


RANK_SCRIPT = """\
import os, signal, sys, time
rank = os.environ.get("PMI_RANK") or os.environ["RANK"]
signal.signal(signal.SIGUSR1, lambda s, f: open(sys.argv[1] + rank, "w").close())
signal.signal(signal.SIGUSR2, lambda s, f: open(sys.argv[1] + rank, "w").close())
open(sys.argv[1] + "up" + rank, "w").close()
time.sleep(3)
"""
BIN = Path(sys.executable).parent


# The evidence behind preemption.PASSES_ON, measured on the MPICH wheel's mpiexec and torch 2.13's torchrun.
@pytest.mark.parametrize("flavour,launcher,name,code", [
    ("hydra", [str(BIN / "mpiexec"), "-n", "2", sys.executable], "USR1", 0),
    ("hydra", [str(BIN / "mpiexec"), "-n", "2", sys.executable], "USR2", -signal.SIGUSR2),
    ("torchrun", [str(BIN / "torchrun"), "--nproc-per-node", "2"], "USR1", -signal.SIGUSR1)])
def test_what_each_mpi_launcher_does_with_the_preemption_signal(tmp_path, flavour, launcher, name, code):
    (tmp_path / "rank.py").write_text(RANK_SCRIPT)
    mark = str(tmp_path / name)
    proc = subprocess.Popen([*launcher, str(tmp_path / "rank.py"), mark])
    while not all(os.path.exists(f"{mark}up{r}") for r in (0, 1)):
        assert proc.poll() is None
        time.sleep(0.05)
    proc.send_signal(preemption.signum(name))
    assert proc.wait(timeout=60) == code
    time.sleep(0.5)  # a rank the signal reached has run its handler by now
    assert all(os.path.exists(f"{mark}{r}") for r in (0, 1)) == (name in preemption.PASSES_ON[flavour])


def test_an_nccl_dump_signal_setting_that_takes_the_preemption_signal_is_refused(monkeypatch):
    assert preemption.conflicts("USR1", {"NCCL_PROXY_DUMP_SIGNAL": "10"}) == "NCCL_PROXY_DUMP_SIGNAL=10"
    assert preemption.conflicts("USR1", {"NCCL_PROXY_DUMP_SIGNAL": "12"}) == ""
    assert preemption.conflicts("USR2", {"NCCL_RMA_PROXY_DUMP_SIGNAL": "12"}) == "NCCL_RMA_PROXY_DUMP_SIGNAL=12"
    with pytest.raises(UsageError, match="NCCL_PROXY_DUMP_SIGNAL=10 makes NCCL take SIGUSR1.*--preempt-signal USR2"):
        preempt_signal.install({contract.PREEMPT_SIGNAL: "USR1", "NCCL_PROXY_DUMP_SIGNAL": "10"})


def test_the_ranks_handler_only_records_the_signal():
    before = signal.getsignal(signal.SIGUSR2)
    try:
        assert preempt_signal.install({}) is None and preempt_signal.install({contract.PREEMPT_SIGNAL: "none"}) is None
        assert preempt_signal.install({contract.PREEMPT_SIGNAL: "USR2"}) == "USR2"
        preempt_signal.received.clear()
        os.kill(os.getpid(), signal.SIGUSR2)
        assert preempt_signal.received == [signal.SIGUSR2] and preempt_signal.name_received() == "SIGUSR2"
        with pytest.raises(UsageError, match="SPRITE_PREEMPT_SIGNAL='TERM' is not allowed"):
            preempt_signal.install({contract.PREEMPT_SIGNAL: "TERM"})
    finally:
        signal.signal(signal.SIGUSR2, before)
        preempt_signal.received.clear()


def test_the_plan_exports_the_signal_and_refuses_requeue_outside_a_job(script):
    env = plan.plan_run({"script": script, "devices": "2"}, environ={}).env
    assert env[contract.PREEMPT_SIGNAL] == "USR1" == preemption.DEFAULT
    env = plan.plan_run({"script": script, "preempt_signal": "sigusr2"}, environ={}).env
    assert env[contract.PREEMPT_SIGNAL] == "USR2"
    env = plan.plan_run({"script": script, "preempt_signal": "none"}, environ={}).env
    assert env[contract.PREEMPT_SIGNAL] == "none"
    with pytest.raises(UsageError, match="--requeue asks the batch system"):
        plan.plan_run({"script": script, "requeue": True}, environ={})
    assert plan.plan_run({"script": script, "requeue": True}, environ=SLURM).world.flavour == "srun"
    with pytest.raises(UsageError, match="Option --preempt-signal: 'TERM' is not a preemption signal"):
        plan.plan_run({"script": script, "preempt_signal": "TERM"}, environ={})


def _beat(rank: int, phase: str) -> Beat:
    return Beat(rank, "nid001", 100 + rank, 6, phase, 9, 0.0, 0)


def test_an_attempt_whose_ranks_stopped_for_preemption_is_a_preemption_whatever_the_launcher_said(script, tmp_path):
    assert classify.classify(EXIT_PREEMPTED, "").cause == PREEMPTION
    launch = plan.plan_run({"script": script, "devices": "2"}, environ={})
    log = tmp_path / "attempt-1.log"
    log.write_text("srun: error: nid001: task 0: Killed\n")  # srun killed the last rank to leave (kill-on-bad-exit)
    both = {r: _beat(r, heartbeat.PREEMPTED) for r in (0, 1)}
    code, verdict = attempt._verdict(137, log, launch, both)
    assert (code, verdict.cause) == (EXIT_PREEMPTED, PREEMPTION)
    code, verdict = attempt._verdict(137, log, launch, {0: both[0], 1: _beat(1, heartbeat.TRAINING)})
    assert code == 137 and verdict.cause != PREEMPTION


def test_a_rank_that_failed_while_the_others_stopped_for_preemption_fails_the_attempt(script, tmp_path, capsys):
    # srun returns the highest code of its tasks: rank 1's exit 1 (its preemption save found the disk full)
    # hides behind rank 0's 75. Its failed heartbeat makes the attempt a failure, not a preemption to requeue.
    launch = plan.plan_run({"script": script, "devices": "2"}, environ={})
    log = tmp_path / "attempt-1.log"
    log.write_text("sprite: received SIGUSR1; passing it to the launcher\n"
                   "1: sprite: error: the checkpoint's files could not be written: [Errno 28] No space left on "
                   "device. Free space, then launch again.\n"
                   "1: sprite: error: A checkpoint saved in the background failed: [Errno 28] No space left.\n"
                   "srun: error: nid001: task 1: Exited with exit code 1\n")
    beats = {0: _beat(0, heartbeat.PREEMPTED), 1: _beat(1, heartbeat.FAILED)}
    code, verdict = attempt._verdict(EXIT_PREEMPTED, log, launch, beats)
    assert (code, verdict.cause) == (1, classify.CHECK_FAILED)
    assert verdict.reason.startswith("rank 1 failed while the others stopped for preemption: the checkpoint's")
    said = capsys.readouterr().err.strip()
    assert said.startswith("sprite: error: The launcher exited 75 (preemption), but rank 1 failed") and "\n" not in said
    assert ".." not in said  # the rank's own line ends in a full stop
    assert not requeue.wanted(True, {"cause": verdict.cause, "exit_code": code})
    log.write_text("[1] Traceback (most recent call last):\n[1] ValueError: bad shape\n")
    code, verdict = attempt._verdict(EXIT_PREEMPTED, log, launch, {**beats, 0: _beat(0, heartbeat.FAILED)})
    assert (code, verdict.cause) == (1, classify.APP_FAULT)
    assert verdict.reason == "ranks 0,1 failed while the others stopped for preemption: rank 1: ValueError: bad shape"
    code, verdict = attempt._verdict(EXIT_PREEMPTED, log, launch, {r: _beat(r, heartbeat.PREEMPTED) for r in (0, 1)})
    assert (code, verdict.cause) == (EXIT_PREEMPTED, PREEMPTION)


def test_requeue_commands_of_each_scheduler(tmp_path):
    where = lambda name: f"/bin/{name}"  # noqa: E731
    assert slurm.Slurm().requeue_argv(SLURM, where) == ["/bin/scontrol", "requeue", "77"]
    array = {**SLURM, "SLURM_ARRAY_JOB_ID": "70", "SLURM_ARRAY_TASK_ID": "3"}
    assert slurm.Slurm().requeue_argv(array, where)[-1] == "70_3"
    job = {"PBS_JOBID": "9.aurora-pbs", contract.JOB_SCRIPT: str(tmp_path / "train.pbs"), pbs.REQUEUE_COUNT: "1"}
    assert pbs.PBS().requeue_argv(job, where) == [
        "/bin/qsub", "-W", "depend=afterany:9.aurora-pbs", "-v", "SPRITE_REQUEUE_COUNT=2",
        "-o", str(tmp_path / "train-requeue2.log"), "-j", "oe", str(tmp_path / "train.pbs")]
    assert pbs.PBS().restart_count(job) == 1
    with pytest.raises(UsageError, match="SPRITE_JOB_SCRIPT or PBS_JOBID is not set"):
        pbs.PBS().requeue_argv({"PBS_JOBID": "9"}, where)
    with pytest.raises(UsageError, match="cannot run a job again"):
        NoScheduler().requeue_argv({}, where)


class _Run:
    def __init__(self, path: Path):
        self.trail = path / "audit.jsonl"

    def record(self, kind: str, **fields) -> dict:
        return audit.append(self.trail, kind, **fields)


def _fake(bin_dir: Path, name: str, code: int) -> Path:
    """A FAKE scheduler client: records its argv in argv.txt beside it and exits with ``code``."""
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / name
    fake.write_text(f'#!/bin/bash\necho "$@" >> {bin_dir}/argv.txt\necho "fake {name} says {code}"\nexit {code}\n')
    fake.chmod(0o755)
    return fake


def test_a_requeue_answer_that_is_not_utf8_is_recorded_with_the_bad_bytes_replaced(tmp_path, monkeypatch):
    """docs/jobs.md: client output that is not UTF-8 is read with the bad bytes replaced, inside a job too (the
    requeue's own qsub call: a strict decode would end sprite run with a traceback at the preemption)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "qsub").write_text("#!/bin/bash\nprintf '10.x \\377 queued\\n'\n")  # a FAKE qsub
    (bin_dir / "qsub").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    job = {"PBS_JOBID": "9.x", "PBS_NODEFILE": "/nodes", contract.JOB_SCRIPT: "/jobs/j.pbs"}
    assert requeue.request(_Run(tmp_path), job)
    assert audit.read(tmp_path / "audit.jsonl")[-1]["answer"] == "10.x \ufffd queued"


@pytest.mark.parametrize("code", [0, 1])
def test_requeue_asks_the_scheduler_and_records_its_answer(tmp_path, monkeypatch, code):
    _fake(tmp_path / "bin", "qsub", code)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    job = {"PBS_JOBID": "9.x", "PBS_NODEFILE": "/nodes", contract.JOB_SCRIPT: "/jobs/j.pbs"}
    done = {"cause": PREEMPTION, "exit_code": EXIT_PREEMPTED}
    assert requeue.wanted(True, done) and not requeue.wanted(False, done)
    assert not requeue.wanted(True, {**done, "exit_code": 143})  # stopped, but no checkpoint of the signal
    assert requeue.request(_Run(tmp_path), job) is (code == 0)
    assert (tmp_path / "bin" / "argv.txt").read_text().split()[-1] == "/jobs/j.pbs"
    record = audit.read(tmp_path / "audit.jsonl")[-1]
    assert (record["kind"], record["accepted"], record["exit_code"], record["job_id"]) == ("requeue", code == 0,
                                                                                         code, "9.x")
    assert f"fake qsub says {code}" in record["answer"]


def test_job_scripts_pass_the_signal_requeue_and_resume_auto(tmp_path):
    spec = tmp_path / "j.job.yaml"
    spec.write_text("site: local\nscript: t.py\nscheduler: {walltime: '00:10:00', preempt_signal: USR2@60,"
                    " requeue: true}\n")
    (tmp_path / "t.py").write_text("")
    text = submit.prepare(str(spec), "slurm", cwd=str(tmp_path)).text
    assert "#SBATCH --signal=B:USR2@60\n#SBATCH --open-mode=append\n#SBATCH --requeue\n" in text
    assert f"export SPRITE_JOB_SCRIPT={tmp_path}/sprite-jobs/j-1.sbatch\n" in text
    assert "--resume auto --preempt-signal USR2 --requeue " in text
    pbs_text = submit.prepare(str(spec), "pbs", cwd=str(tmp_path)).text
    assert "#PBS -r y" in pbs_text and f"export SPRITE_JOB_SCRIPT={tmp_path}/sprite-jobs/j-1.pbs\n" in pbs_text
    assert 'kill -s USR2 "$sprite_pid"' in pbs_text and "--preempt-signal USR2 --requeue" in pbs_text
    assert "( sleep 540 && kill -s USR2" in pbs_text  # 60 s before the 10 min walltime (docs/long-runs.md)
    spec.write_text(spec.read_text() + "resume: never\n")
    with pytest.raises(UsageError, match="resume: never with scheduler.requeue: true"):
        submit.prepare(str(spec), "slurm", cwd=str(tmp_path))
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "meta.pt").write_bytes(b"x")
    from sprite import integrity

    integrity.seal(tmp_path / "ck", {"step": 1})  # a sealed checkpoint: refused for the requeue, not for itself
    spec.write_text(spec.read_text().replace("resume: never", f"resume: {tmp_path / 'ck'}"))
    with pytest.raises(UsageError, match="resume: .*ck with scheduler.requeue: true"):  # any value but auto
        submit.prepare(str(spec), "slurm", cwd=str(tmp_path))
    spec.write_text(spec.read_text().replace(f"resume: {tmp_path / 'ck'}", "resume: never"))
    spec.write_text(spec.read_text().replace("resume: never", "preempt_signal: USR1"))
    with pytest.raises(UsageError, match="preempt_signal: USR1 contradicts scheduler.preempt_signal: USR2@60"):
        submit.prepare(str(spec), "slurm", cwd=str(tmp_path))


def test_the_local_supervisor_lets_every_rank_stop_for_preemption(tmp_path):
    rank = tmp_path / "rank.py"
    # rank 1 stops 1.5 s after rank 0, as a rank still leaving the process group would
    rank.write_text("import os, sys, time\ntime.sleep(1.5 * int(os.environ['RANK']))\n"
                    "open(os.path.join(sys.argv[1], 'left' + os.environ['RANK']), 'w').close()\nsys.exit(75)\n")
    done = subprocess.run([sys.executable, "-m", "sprite.launch.supervisor", "--nproc", "2", "--", sys.executable, str(rank),
                           str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == EXIT_PREEMPTED, done.stderr
    assert (tmp_path / "left0").exists() and (tmp_path / "left1").exists(), done.stderr
    assert "stopping the other ranks" not in done.stderr


def test_the_local_supervisor_stops_ranks_still_running_60_s_after_one_stopped_for_preemption(monkeypatch, capfd):
    """docs/run.md: a rank that exits 75 is no failure, and the others get 60 s to stop the same way; one still
    running then is stopped, and the launch exits 75."""
    from sprite.launch import supervisor

    assert supervisor.PREEMPT_WAIT == 60.0
    monkeypatch.setattr(supervisor, "PREEMPT_WAIT", 0.5)
    procs = [subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(75)"]),
             subprocess.Popen(["sleep", "33.3"], start_new_session=True)]
    start = time.monotonic()
    assert supervisor.supervise(procs, []) == EXIT_PREEMPTED
    assert time.monotonic() - start < 15 and procs[1].wait(10) is not None
    assert "ran on 0 s after one stopped for preemption" in capfd.readouterr().err


def test_the_preemption_save_goes_where_resume_auto_looks(tmp_path):
    from lightning.pytorch import Trainer
    from lightning.pytorch.callbacks import ModelCheckpoint

    from sprite.runtime import preempt
    from sprite.runtime.ckpt import resume

    for kwargs in ({"callbacks": [ModelCheckpoint(dirpath=tmp_path / "mine")]}, {"enable_checkpointing": False}):
        trainer = Trainer(default_root_dir=tmp_path, logger=False, **kwargs)
        assert preempt.checkpoint_folder(trainer) in resume.checkpoint_dirs(trainer)
    assert preempt.checkpoint_folder(trainer) == str(tmp_path / "checkpoints")


class _Trainer:
    def __init__(self, world_size):
        import torch

        self.world_size, self.strategy = world_size, type("Strategy", (), {"root_device": torch.device("cpu")})()


@pytest.mark.parametrize("world, collectives", [(1, 0), (2, 1)])
def test_one_rank_reads_its_own_flag_and_several_agree_through_one_all_reduce(monkeypatch, world, collectives):
    import torch.distributed as dist

    from sprite.runtime import preempt

    calls = []
    monkeypatch.setattr(dist, "all_reduce", lambda tensor, op: calls.append((int(tensor.item()), op)))
    monkeypatch.setattr(dist, "barrier", lambda *a, **k: calls.append("barrier"))  # Lightning's reduce has one
    trainer = _Trainer(world)
    monkeypatch.setattr(preempt_signal, "received", [])
    assert preempt.PreemptCallback._any_rank_signalled(trainer) is False
    monkeypatch.setattr(preempt_signal, "received", [signal.SIGUSR1])
    assert preempt.PreemptCallback._any_rank_signalled(trainer) is True
    # no per-step collective (a device sync) for one rank; one MAX all-reduce and no barrier for several
    assert calls == [(0, dist.ReduceOp.MAX), (1, dist.ReduceOp.MAX)][:2 * collectives]
