"""Launch overhead of sprite run, each figure against a baseline measured in the same run.

(a) `sprite run --dry-run` planning a 10,624-node Aurora job (PBS_NODEFILE of 10,624 hosts), against
    `python -c "import torch"`; also checks that no torch or lightning module is imported on that path.
(b) a 2-rank CPU fit of examples/train.py started by `sprite run`, against the same script under
    `torchrun --nproc-per-node 2` (Lightning's own torchelastic path), runs interleaved.

    python benchmarks/launch_overhead.py [--repeats 5] [--fit-repeats 3] [--steps 50]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
EXAMPLE = REPO / "examples" / "train.py"
AURORA_NODES = 10_624


def timed(cmd: list[str], env: dict) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def clean_env() -> dict:
    drop = ("PBS_JOBID", "PBS_NODEFILE", "SLURM_JOB_ID", "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["PATH"] = os.pathsep.join([str(BIN), env.get("PATH", "")])
    return env


def planning(repeats: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        nodefile = Path(tmp) / "nodefile"
        nodefile.write_text("".join(f"x{4000 + i // 64}c{i % 8}s{i % 7}b0n0\n" for i in range(AURORA_NODES)))
        env = {**clean_env(), "PBS_JOBID": "1.aurora-pbs", "PBS_NODEFILE": str(nodefile)}
        dry = [str(BIN / "sprite"), "run", "--site", "aurora", "--strategy", "fsdp", "--dry-run", "--json", str(EXAMPLE)]
        probe = ("import sys; sys.argv = " + repr(["sprite", *dry[1:]]) + "\nfrom sprite.cli import app as cli\ntry:\n"
                 "    cli.main()\nexcept SystemExit:\n    pass\nheavy = sorted({m.split('.')[0] for m in sys.modules}"
                 " & {'torch', 'lightning', 'pytorch_lightning'})\nsys.stderr.write(repr(heavy))")
        heavy = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True).stderr
        torch_cmd = [sys.executable, "-c", "import torch"]
        pairs = [(timed(dry, env), timed(torch_cmd, env)) for _ in range(repeats)]
    sprite_s = statistics.median(p[0] for p in pairs)
    torch_s = statistics.median(p[1] for p in pairs)
    print(f"(a) sprite run --dry-run, {AURORA_NODES} Aurora nodes ({AURORA_NODES * 12} ranks): "
          f"{sprite_s * 1000:.0f} ms median of {repeats}")
    print(f"    baseline python -c 'import torch': {torch_s * 1000:.0f} ms median of {repeats}")
    print(f"    ratio {sprite_s / torch_s:.3f} (target well under 0.3); heavy modules imported: {heavy}")


def fits(repeats: int, steps: int) -> None:
    env = clean_env()
    script = [str(EXAMPLE), "--max-steps", str(steps)]
    sprite_cmd = [str(BIN / "sprite"), "run", "--devices", "2", "--launcher", "local", *script]
    torchrun_cmd = [str(BIN / "torchrun"), "--nproc-per-node", "2", "--master-port", "29517", *script]
    pairs = [(timed(sprite_cmd, env), timed(torchrun_cmd, env)) for _ in range(repeats)]
    sprite_s = statistics.median(p[0] for p in pairs)
    torchrun_s = statistics.median(p[1] for p in pairs)
    print(f"(b) 2-rank CPU fit, {steps} steps, sprite run (local supervisor): {sprite_s:.2f} s median of {repeats}")
    print(f"    baseline torchrun --nproc-per-node 2, same script: {torchrun_s:.2f} s median of {repeats}")
    print(f"    ratio {sprite_s / torchrun_s:.3f} (target <= 1.05)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--fit-repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=50)
    args = parser.parse_args()
    planning(args.repeats)
    fits(args.fit_repeats, args.steps)


if __name__ == "__main__":
    main()
