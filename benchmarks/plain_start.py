"""Start-up of a plain torch.distributed script's ranks under sprite: the runtime imports Lightning only when the
script does (a8e54d2), measured against the same script importing Lightning itself, which is what every rank paid
before. Same run, interleaved.

Each launch is `sprite run --launcher mpiexec --devices N --accelerator cpu SCRIPT`: MPICH Hydra starts every rank
as a fresh interpreter (the local launcher would fork them from a supervisor that imported Lightning already).
The script joins the world, all-reduces one tensor and leaves. Reported: the wall time and the CPU time of the
whole launch (every process's, from the children's rusage), as ratios plain / with Lightning.

    python benchmarks/plain_start.py [--repeats 3] [--devices 2]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BIN = Path(sys.executable).parent
SCRIPT = """import sys
{extra}import torch
import torch.distributed as dist

dist.init_process_group("gloo")
value = torch.ones(1)
dist.all_reduce(value)
assert value.item() == dist.get_world_size()
assert ("lightning.pytorch" in sys.modules) == {lightning}
dist.destroy_process_group()
"""


def launch(script: Path, devices: int, run_dir: Path) -> tuple[float, float]:
    """(wall seconds, CPU seconds of every process of the launch)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PBS_", "SPRITE_")) and
           k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")}
    env["PATH"] = os.pathsep.join([str(BIN), env.get("PATH", "")])
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run([str(BIN / "sprite"), "run", "--launcher", "mpiexec", "--devices", str(devices),
                           "--accelerator", "cpu", "--run-dir", str(run_dir), str(script)], env=env,
                          capture_output=True, text=True, cwd=run_dir.parent)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"{script.name} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--devices", type=int, default=2)
    args = parser.parse_args()
    if args.repeats < 1 or args.devices < 1:
        parser.error("--repeats and --devices must be 1 or more")
    if not shutil.which("mpiexec", path=os.pathsep.join([str(BIN), os.environ.get("PATH", "")])):
        sys.exit("no mpiexec: pip install mpich (the test extra has it)")
    found = {"plain": [], "lightning": []}
    with tempfile.TemporaryDirectory() as tmp:
        scripts = {}
        for arm, extra in (("plain", ""), ("lightning", "import lightning.pytorch  # what every rank paid before\n")):
            scripts[arm] = Path(tmp) / f"{arm}_arm.py"  # not lightning.py: it would shadow the package
            scripts[arm].write_text(SCRIPT.format(extra=extra, lightning=arm == "lightning"))
        for repeat in range(args.repeats):
            order = ("plain", "lightning") if repeat % 2 == 0 else ("lightning", "plain")  # alternate the first
            for arm in order:
                found[arm].append(launch(scripts[arm], args.devices, Path(tmp) / f"run-{arm}-{repeat}"))
    for arm in found:
        walls, cpus = zip(*found[arm])
        print(f"{arm:9s}: wall {statistics.median(walls):6.2f} s, CPU {statistics.median(cpus):6.2f} s "
              f"(medians of {args.repeats})")
    wall = statistics.median(w for w, _ in found["plain"]) / statistics.median(w for w, _ in found["lightning"])
    cpu = statistics.median(c for _, c in found["plain"]) / statistics.median(c for _, c in found["lightning"])
    print(f"plain / with Lightning: wall {wall:.2f}, CPU {cpu:.2f}")


if __name__ == "__main__":
    main()
