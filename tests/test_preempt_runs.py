"""Preemption in real 2-rank gloo DDP fits: checkpoint at the next step, exit 75, resume bit for bit.

tests/scripts/ckpt_fit.py (dropout, shuffled data, a ModelCheckpoint every 3 steps, 8 steps an epoch, 20 steps)
holds every rank at a chosen step until the test has sent the signal, so the step each run stops at is known.
One uninterrupted fit is the reference for all of them:

- a chain without Slurm: under the local launcher the signal goes to `sprite run` (stops at step 5); `--resume
  auto` under MPICH `mpiexec` continues, and this time the signal goes to rank 1 alone, straight from the test
  (rank 0 never gets it, and stops at step 11 all the same); a last local `--resume auto` finishes;
- two jobs on the real Slurm of tests/slurm_cluster.py, `sprite sbatch` with `requeue: true`: one signalled the
  way `scancel --signal` does by default (to the ranks, through srun's step) at the end of epoch 0 (step 8), one
  the way `#SBATCH --signal=B:` does (to the batch shell, `sprite run`, which passes it through srun) in the
  middle of epoch 1 (step 13). Each requeues itself; the test then lifts Slurm's hold on a requeued job
  (`scontrol update StartTime=now`, as an operator may: about 120 s otherwise) and the job finishes.
Every run's per-step losses (as float.hex) and final weights (with a buffer counted by the module's own
``on_train_batch_end``, which the preemption save must not skip) must equal the reference's exactly.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from slurm_cluster import slurm  # noqa: F401  (fixture)
from sprite import integrity
from sprite.integrity import audit
from sprite.errors import EXIT_PREEMPTED
from conftest import sprite_free_env

pytestmark = pytest.mark.slow

SCRIPT = str(Path(__file__).resolve().parent / "scripts" / "ckpt_fit.py")
VENV_BIN = str(Path(sys.executable).parent)
SETTLE = 2.0  # seconds a signal gets to reach a rank's handler once it was sent (the handler runs within 0.05 s)
STRIP = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "NODE_RANK", "PBS_JOBID", "SLURM_JOB_ID")


def _env(base=None) -> dict:
    env = sprite_free_env(STRIP, base)
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"  # the MPICH wheel's mpiexec first
    return env


def fit_args(root: Path, tag: str, ckpt: Path, hold: int = -1) -> list[str]:
    return [SCRIPT, "--out", str(root), "--tag", tag, "--ckpt-dir", str(ckpt), "--hold-at-step", str(hold),
            "--hold-dir", str(root / f"hold-{tag}"), "--count-batches"]


def wait_held(folder: Path, watched, timeout: float = 300, evidence=lambda: "", ranks: int = 2) -> None:
    """Until every rank wrote held-rank<N>; ``watched()`` says whether the run is still going, ``evidence()`` what
    to show when it is not."""
    deadline = time.monotonic() + timeout
    while not all((folder / f"held-rank{r}").exists() for r in range(ranks)):
        assert watched() and time.monotonic() < deadline, \
            f"the ranks never reached the hold step ({folder}): {evidence()}"
        time.sleep(0.1)


def wait_for(path: Path, text: str, timeout: float = 60) -> None:
    """Until ``path`` holds ``text``, then SETTLE seconds more: the signal is on its way to the ranks."""
    deadline = time.monotonic() + timeout
    while not (path.exists() and text in path.read_text()):
        assert time.monotonic() < deadline, f"{text!r} never appeared in {path}"
        time.sleep(0.1)
    time.sleep(SETTLE)


def run_held(sprite_cmd, root: Path, tag: str, flags: list, ckpt: Path, hold: int, signal_to, ranks: int = 2,
             script_flags: tuple = ()) -> dict:
    """`sprite run` that holds at step ``hold``; ``signal_to(proc, run_dir, log)`` sends the signal and waits until
    it is on its way to the ranks (evidence in the log, then SETTLE seconds); then the ranks go."""
    (root / f"hold-{tag}").mkdir()
    run_dir = root / f"run-{tag}"
    with open(root / f"{tag}.log", "w") as log:
        proc = subprocess.Popen([*sprite_cmd, "run", "--devices", str(ranks), "--run-dir", str(run_dir), *flags,
                                 *fit_args(root, tag, ckpt, hold), *script_flags], cwd=root, env=_env(),
                                stdout=log, stderr=log)
        try:
            if hold >= 0:
                wait_held(root / f"hold-{tag}", lambda: proc.poll() is None, ranks=ranks)
                signal_to(proc, run_dir, root / f"{tag}.log")
                (root / f"hold-{tag}" / "go").touch()
            code = proc.wait(timeout=400)
        finally:
            if proc.poll() is None:
                proc.kill()
    return {"code": code, "log": (root / f"{tag}.log").read_text(), "run_dir": run_dir}


def to_sprite_run(proc, run_dir, log) -> None:
    proc.send_signal(signal.SIGUSR1)
    wait_for(log, "sprite: passing SIGUSR1 on to every rank.")  # the local supervisor has signalled the ranks


def to_rank_1_only(proc, run_dir, log) -> None:
    beat = json.loads((run_dir / "heartbeat" / "attempt-1" / "rank1.json").read_text())
    os.kill(beat["pid"], signal.SIGUSR1)
    time.sleep(SETTLE)


def losses(root: Path, tag: str, rank: int) -> dict:
    """Step -> loss (float.hex) of every training step a run of ``tag`` logged; a step logged twice fails."""
    seen: dict = {}
    with open(root / f"losses-{tag}-rank{rank}.jsonl") as lines:
        for record in map(json.loads, lines):
            assert record["step"] not in seen, f"{tag}: step {record['step']} trained twice"
            seen[record["step"]] = record["loss"]
    return seen


def same_weights(got_path: Path, want_path: Path) -> bool:
    import torch

    got, want = torch.load(got_path), torch.load(want_path)
    return got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)


@pytest.fixture(scope="module")
def runs(sprite_cmd, tmp_path_factory):
    root = tmp_path_factory.mktemp("preempt")
    out = {"root": root, "ck": root / "chain_ck"}
    out["ref"] = run_held(sprite_cmd, root, "ref", [], root / "ref_ck", -1, None)
    out["c1"] = run_held(sprite_cmd, root, "c1", [], out["ck"], 4, to_sprite_run)
    out["c1_files"] = sorted(os.listdir(out["ck"]))
    out["c2"] = run_held(sprite_cmd, root, "c2", ["--launcher", "mpiexec", "--resume", "auto"], out["ck"], 10,
                         to_rank_1_only)
    out["c3"] = run_held(sprite_cmd, root, "c3", ["--resume", "auto"], out["ck"], -1, None)
    return out


def test_the_reference_fit_finishes(runs):
    assert runs["ref"]["code"] == 0, runs["ref"]["log"][-3000:]


def test_signal_to_sprite_run_saves_a_sealed_checkpoint_at_the_next_step_and_exits_75(runs):
    c1 = runs["c1"]
    assert c1["code"] == EXIT_PREEMPTED, c1["log"][-3000:]
    assert "sprite: received SIGUSR1; passing it to the launcher." in c1["log"]
    assert "preempted: the signal reached rank(s) 0,1; every rank saved" in c1["log"]
    assert "preempted-epoch=0-step=5.ckpt" in runs["c1_files"]
    assert "preempted-epoch=0-step=5.ckpt.sprite-manifest.json" in runs["c1_files"]
    assert max(losses(runs["root"], "c1", 0)) == 4  # the held step trained, and no step after it
    records = audit.read(c1["run_dir"] / "audit.jsonl")
    stop = next(r for r in records if r["kind"] == "preemption")
    assert (stop["signal"], stop["signalled_ranks"], stop["step"]) == ("SIGUSR1", [0, 1], 5)
    end = next(r for r in records if r["kind"] == "attempt_end")
    assert (end["cause"], end["exit_code"]) == ("preemption", EXIT_PREEMPTED)
    assert next(r for r in records if r["kind"] == "completion")["status"] == "preempted"
    assert audit.verify(c1["run_dir"] / "audit.jsonl")[0]


def test_under_mpiexec_a_signal_that_reached_one_rank_stops_both_at_the_same_step(runs):
    c2 = runs["c2"]
    assert c2["code"] == EXIT_PREEMPTED, c2["log"][-3000:]
    assert f"resume: from {runs['ck'] / 'preempted-epoch=0-step=5.ckpt'} (step 5, epoch 0)" in c2["log"]
    assert "preempted: the signal reached rank(s) 1; every rank saved" in c2["log"]
    verdict = integrity.verify(runs["ck"] / "preempted-epoch=1-step=11.ckpt")
    assert verdict.valid and verdict.manifest["meta"]["step"] == 11, verdict.reason
    for rank in (0, 1):
        assert sorted(losses(runs["root"], "c2", rank)) == list(range(5, 11))


def test_the_resumed_chain_equals_the_uninterrupted_fit_bit_for_bit(runs):
    c3 = runs["c3"]
    assert c3["code"] == 0, c3["log"][-3000:]
    assert "(step 11, epoch 1)" in c3["log"]
    for rank in (0, 1):
        stitched = {**losses(runs["root"], "c1", rank), **losses(runs["root"], "c2", rank),
                    **losses(runs["root"], "c3", rank)}
        assert stitched == losses(runs["root"], "ref", rank)
    assert same_weights(runs["root"] / "final-c3.pt", runs["root"] / "final-ref.pt")


def _batches(root: Path, tag: str, rank: int) -> dict:
    """(step, batch) -> loss of every batch a run of ``tag`` trained; a batch trained twice fails."""
    seen: dict = {}
    for record in map(json.loads, (root / f"losses-{tag}-rank{rank}.jsonl").read_text().splitlines()):
        key = (record["step"], record["batch"])
        assert key not in seen, f"{tag}: step {key[0]}, batch {key[1]} trained twice"
        seen[key] = record["loss"]
    return seen


def test_a_signal_in_the_middle_of_gradient_accumulation_stops_at_the_optimizer_step_and_resumes_bit_for_bit(
        sprite_cmd, tmp_path):
    """docs/long-runs.md: the ranks stop at the next optimizer step, never between the batches one step
    accumulates. Two batches a step (4 steps an epoch), held at the first batch of step 5 and signalled there: the
    second batch of step 5 still trains, the checkpoint is of step 6, and the resumed fit equals the reference."""
    accumulate = ("--accumulate", "2", "--max-steps", "8")
    ref = run_held(sprite_cmd, tmp_path, "aref", [], tmp_path / "aref_ck", -1, None, script_flags=accumulate)
    assert ref["code"] == 0, ref["log"][-3000:]
    ck = tmp_path / "achain_ck"
    first = run_held(sprite_cmd, tmp_path, "a1", [], ck, 5, to_sprite_run, script_flags=accumulate)
    assert first["code"] == EXIT_PREEMPTED, first["log"][-3000:]
    stop = next(r for r in audit.read(first["run_dir"] / "audit.jsonl") if r["kind"] == "preemption")
    assert stop["step"] == 6 and stop["checkpoint"].endswith("preempted-epoch=1-step=6.ckpt"), stop
    assert integrity.verify(stop["checkpoint"]).valid
    for rank in (0, 1):
        trained = _batches(tmp_path, "a1", rank)
        assert max(trained) == (5, 3) and (5, 2) in trained  # both batches of step 5 (epoch 1's third and fourth)
    second = run_held(sprite_cmd, tmp_path, "a2", ["--resume", "auto"], ck, -1, None, script_flags=accumulate)
    assert second["code"] == 0, second["log"][-3000:]
    assert "(step 6, epoch 1)" in second["log"]
    for rank in (0, 1):
        stitched = {**_batches(tmp_path, "a1", rank), **_batches(tmp_path, "a2", rank)}
        assert stitched == _batches(tmp_path, "aref", rank)
    assert same_weights(tmp_path / "final-a2.pt", tmp_path / "final-aref.pt")


def test_one_rank_stops_for_the_signal_though_a_c_library_took_it_beneath_python(sprite_cmd, tmp_path):
    """On one H200 a rank's MPI start-up (Open MPI's, through mpi4py) replaced the handler beneath Python and the
    fit trained on (docs/runs/h200-2026-12-03-c). The script here takes SIGUSR1 the same way, through libc, before
    the Trainer exists; the handler installed again as training starts must still stop the fit."""
    got = run_held(sprite_cmd, tmp_path, "one", [], tmp_path / "ck", 3, to_sprite_run, ranks=1,
                   script_flags=("--usr1-taken-beneath-python",))
    assert got["code"] == EXIT_PREEMPTED, got["log"][-3000:]
    assert "preempted: the signal reached rank(s) 0; every rank saved" in got["log"]
    assert integrity.verify(tmp_path / "ck" / "preempted-epoch=0-step=4.ckpt").valid


# ---- the real Slurm ----

def _submit(cluster, root: Path, tag: str, hold: int) -> str:
    spec = {"site": "local", "script": SCRIPT, "devices": 2, "accelerator": "cpu", "strategy": "ddp",
            "args": fit_args(root, tag, root / f"{tag}_ck", hold)[1:],
            "scheduler": {"walltime": "00:15:00", "preempt_signal": "USR1@60", "requeue": True, "job_name": tag}}
    (root / f"hold-{tag}").mkdir()
    (root / f"{tag}.job.yaml").write_text(yaml.safe_dump(spec))
    done = subprocess.run([sys.executable, "-m", "sprite", "sbatch", str(root / f"{tag}.job.yaml")], cwd=root,
                          env={**_env(cluster.env), "SLURM_CONF": cluster.env["SLURM_CONF"]}, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout.split("submitted slurm job ")[1].split()[0]


ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE",
         "PREEMPTED")


def _tail_of(path: Path) -> str:
    return path.read_text()[-3000:] if path.exists() else f"(no {path})"


def _log(root: Path, tag: str, job_id: str) -> Path:
    """The job's log: its script is the first submission named ``tag``, so ``<tag>-1`` (sprite.jobs.files)."""
    return root / "sprite-jobs" / f"{tag}-1-{job_id}.log"


def _preempt_and_finish(cluster, root: Path, tag: str, job_id: str, scancel_flags: list) -> dict:
    # Over until Slurm says the job ended: a busy slurmctld can leave one `scontrol show job` empty (a CI run saw
    # the wait give up while the job ran), and a job passes through CONFIGURING and COMPLETING too.
    wait_held(root / f"hold-{tag}", lambda: cluster.job(job_id).get("JobState") not in ENDED,
              evidence=lambda: f"{cluster.job(job_id)}; log: {_tail_of(_log(root, tag, job_id))}")
    subprocess.run(["scancel", *scancel_flags, "--signal=USR1", job_id], env=cluster.env, check=True, timeout=60)
    if "--batch" in scancel_flags:  # to `sprite run`, which says so before it passes the signal to srun
        wait_for(_log(root, tag, job_id), "sprite: received SIGUSR1; passing it to the launcher.")
    time.sleep(SETTLE)  # scancel returns once slurmctld has the request; the ranks get it from their slurmstepd
    (root / f"hold-{tag}" / "go").touch()
    deadline, lifted = time.monotonic() + 400, False
    while time.monotonic() < deadline:
        info = cluster.job(job_id)
        if info.get("Restarts") == "1" and info.get("JobState") == "PENDING" and not lifted:
            # Slurm holds a requeued job for cred_expire (120 s); an operator may start it at once, but not in
            # the second of the requeue: slurmd refuses a credential made in the second its job's credentials
            # were revoked ("Killing non-startable batch JobId=1: Job credential revoked", slurmctld.log here).
            time.sleep(2)
            subprocess.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"], env=cluster.env, check=True)
            lifted = True
        if info.get("JobState") in ENDED:
            break
        time.sleep(0.5)
    log = _log(root, tag, job_id)
    folder = root / "sprite-runs"
    runs = sorted(folder.iterdir(), key=lambda p: audit.read(p / "audit.jsonl")[0]["time"]) if folder.is_dir() else []
    return {"info": info, "lifted": lifted, "log": log.read_text() if log.exists() else "", "runs": runs}


@pytest.fixture(scope="module")
def jobs(slurm, runs):  # noqa: F811  (the fixture of slurm_cluster)
    out = {}
    for tag, hold, flags in (("s1", 7, []), ("s2", 11, ["--batch"])):
        root = runs["root"] / tag
        root.mkdir()
        job_id = _submit(slurm, root, tag, hold)
        out[tag] = {"root": root, "id": job_id, **_preempt_and_finish(slurm, root, tag, job_id, flags)}
    return out


@pytest.mark.parametrize("tag,step,epoch", [("s1", 8, 0), ("s2", 12, 1)])
def test_a_slurm_job_checkpoints_requeues_itself_and_finishes_bit_for_bit(jobs, runs, tag, step, epoch):
    job = jobs[tag]
    log = job["log"]
    assert job["info"]["JobState"] == "COMPLETED" and job["info"]["Restarts"] == "1", (job["info"], log[-4000:])
    assert job["lifted"], log[-4000:]
    assert f"every rank saved {job['root'] / f'{tag}_ck' / f'preempted-epoch={epoch}-step={step}.ckpt'}" in log
    preempted = job["root"] / f"{tag}_ck" / f"preempted-epoch={epoch}-step={step}.ckpt"
    assert f"resume: from {preempted} (step {step}, epoch {epoch})" in log  # the log is kept: open-mode=append
    if step % 3 == 0:  # ModelCheckpoint (every 3 steps) ran before the preemption save at the same step
        assert (job["root"] / f"{tag}_ck" / f"epoch={epoch}-step={step}.ckpt").exists()
    first, second = (audit.read(path / "audit.jsonl") for path in job["runs"])
    asked = next(r for r in first if r["kind"] == "requeue")
    assert asked["accepted"] and asked["command"][-2:] == ["requeue", job["id"]]
    assert next(r for r in first if r["kind"] == "completion")["status"] == "preempted"
    assert [r.get("restart_count") for r in second if r["kind"] == "requeue"] == [1]
    assert next(r for r in second if r["kind"] == "completion")["status"] == "succeeded"
    for rank in (0, 1):
        assert losses(job["root"], tag, rank) == losses(runs["root"], "ref", rank)
    assert same_weights(job["root"] / f"final-{tag}.pt", runs["root"] / "final-ref.pt")


def test_goodput_of_a_requeued_slurm_job_covers_both_of_its_runs(jobs):
    """`sprite runs goodput` given the first run of a job that Slurm requeued finds the second (issue 30); the
    categories sum to the total, and the requeued run's start-up counts as restart."""
    job = jobs["s1"]
    first = job["runs"][0]
    asked = [sys.executable, "-m", "sprite", "runs", "goodput", str(first)]
    done = subprocess.run([*asked, "--json"], cwd=job["root"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    hours = json.loads(done.stdout)["device_hours"]
    parts = sum(value for key, value in hours.items() if key != "total")
    assert hours["total"] > 0 and abs(parts - hours["total"]) <= 0.02 * hours["total"], hours
    assert hours["productive"] > 0 and hours["restart"] > 0, hours
    table = subprocess.run(asked, cwd=job["root"], capture_output=True, text=True, timeout=120)
    assert "(2 runs of one job)" in table.stdout, table.stdout + table.stderr
