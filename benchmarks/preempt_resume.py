"""A preempted and resumed fit against an uninterrupted one (2 DDP ranks unless told), and what the check costs.

    python benchmarks/preempt_resume.py                                   # CPU, gloo (a few minutes on 2 cores)
    python benchmarks/preempt_resume.py --accelerator cuda --devices 2    # 2 GPUs, NCCL
    python benchmarks/preempt_resume.py --accelerator cuda --devices 1 --strategy fsdp  # sharded checkpoints

Four `sprite run` fits of tests/scripts/ckpt_fit.py (dropout, shuffled data, ModelCheckpoint every 50 steps):
``--preempt-signal none`` (the baseline: no handler, no per-step check), the reference (default SIGUSR1
handling, uninterrupted), a fit held at step ``--stop-at`` while SIGUSR1 goes to `sprite run` (it must save a
sealed checkpoint at the next step and exit 75), and its ``--resume auto``. Prints the exit codes, whether each
run's per-step losses (float.hex, every rank) and final weights equal the reference's bit for bit, the median
step time with the check against the baseline's (a ratio; the script itself reads its loss every step, so
both already synchronise once a step), and the seconds from the signal to exit 75.
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "tests" / "scripts" / "ckpt_fit.py"


def fit(work: Path, tag: str, opts, flags: list, hold: int = -1) -> tuple[int, float]:
    """Run one fit; with ``hold`` send SIGUSR1 to sprite run while the ranks wait at that step. Returns the exit
    code and the seconds from the signal to the exit (0 without a hold)."""
    (work / f"hold-{tag}").mkdir()
    argv = [sys.executable, "-m", "sprite", "run", "--devices", str(opts.devices), "--accelerator", opts.accelerator,
            "--strategy", opts.strategy, "--run-dir", str(work / f"run-{tag}"), *flags, str(SCRIPT), "--out", str(work),
            "--tag", tag, "--ckpt-dir", str(work / "ck" if tag in ("stop", "resume") else work / f"ck-{tag}"),
            "--max-steps", str(opts.steps), "--every", "50", "--hold-at-step", str(hold),
            "--hold-dir", str(work / f"hold-{tag}")]
    with open(work / f"{tag}.log", "w") as log:
        proc = subprocess.Popen(argv, cwd=work, stdout=log, stderr=log)
        sent = None
        if hold >= 0:
            held = [work / f"hold-{tag}" / f"held-rank{r}" for r in range(opts.devices)]
            while not all(p.exists() for p in held):
                if proc.poll() is not None:
                    return proc.returncode, 0.0
                time.sleep(0.1)
            proc.send_signal(signal.SIGUSR1)
            sent = time.monotonic()
            time.sleep(3)  # the signal reaches every rank's handler while they wait
            (work / f"hold-{tag}" / "go").touch()
        code = proc.wait()
    return code, time.monotonic() - sent if sent else 0.0


def records(work: Path, tag: str, rank: int) -> dict:
    with open(work / f"losses-{tag}-rank{rank}.jsonl") as lines:
        return {r["step"]: r for r in map(json.loads, lines)}


def step_time(work: Path, tag: str, skip: int = 10) -> float:
    """Median seconds between consecutive steps of rank 0, after the first ``skip``."""
    got = records(work, tag, 0)
    steps = sorted(s for s in got if s >= skip)
    return statistics.median(got[b]["t"] - got[a]["t"] for a, b in zip(steps, steps[1:]) if b == a + 1)


def same(work: Path, tags: tuple, opts) -> bool:
    """Losses of the runs in ``tags`` together equal the reference's, every rank, every step."""
    for rank in range(opts.devices):
        joined = {}
        for tag in tags:
            joined.update({s: r["loss"] for s, r in records(work, tag, rank).items()})
        if joined != {s: r["loss"] for s, r in records(work, "ref", rank).items()}:
            return False
    return True


def same_weights(work: Path, tag: str) -> bool:
    import torch

    got, want = torch.load(work / f"final-{tag}.pt"), torch.load(work / "final-ref.pt")
    return got.keys() == want.keys() and all(torch.equal(got[k].cpu(), want[k].cpu()) for k in want)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--accelerator", default="cpu")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--stop-at", type=int, default=117, help="the step held while the signal is sent")
    parser.add_argument("--strategy", default="ddp", choices=("ddp", "fsdp"),
                        help="fsdp: FSDP2, whose checkpoints are sharded folders")
    opts = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="sprite-preempt-"))
    codes = {tag: fit(work, tag, opts, flags, hold) for tag, flags, hold in (
        ("none", ["--preempt-signal", "none"], -1), ("ref", [], -1), ("stop", [], opts.stop_at),
        ("resume", ["--resume", "auto"], -1))}
    print(f"work folder {work}")
    print("exit codes  " + ", ".join(f"{tag} {code}" for tag, (code, _) in codes.items()) + " (want 0, 0, 75, 0)")
    if any(code for tag, (code, _) in codes.items() if tag != "stop") or codes["stop"][0] != 75:
        print("FAIL: see the logs in the work folder")
        return 1
    saved = sorted(p.name for p in (work / "ck").glob("preempted-*.ckpt"))
    print(f"preemption  saved {saved} {codes['stop'][1]:.1f} s after the signal (3 s of it the test's own wait)")
    control, resumed = same(work, ("none",), opts), same(work, ("stop", "resume"), opts)
    weights = same_weights(work, "resume") and same_weights(work, "none")
    print(f"bit for bit uninterrupted without the check = reference: {control}; preempted + resumed = reference: "
          f"{resumed}; final weights: {weights}")
    with_check, without = step_time(work, "ref"), step_time(work, "none")
    print(f"step time   {with_check * 1e3:.3f} ms with the check vs {without * 1e3:.3f} ms without, ratio "
          f"{with_check / without:.3f} (median over steps 10-{opts.steps - 1}, rank 0)")
    stopped_next = len(saved) == 1 and saved[0].endswith(f"-step={opts.stop_at + 1}.ckpt")
    return 0 if control and resumed and weights and stopped_next else 1

if __name__ == "__main__":
    sys.exit(main())
