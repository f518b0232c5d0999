"""Finished fits must end 0: N consecutive 2-rank CPU fits with a validation loop, per launcher, failures counted.

    python benchmarks/finish_stress.py --runs 50

Launchers: sprite run with its local supervisor, sprite run with MPICH Hydra ``mpiexec``, and plain ``torchrun
--nproc-per-node 2`` of the same script without sprite (the baseline: it tears nothing down explicitly, as most
scripts do not). Two more rows isolate the cause sprite's runtime fixes (sprite/runtime/finish.py): 5 plain torch
gloo processes doing one all_gather and exiting, without and with ``destroy_process_group``. Prints, per row, the
failed runs and the kind of each failure (e.g. "terminate called without an active exception": a gloo rank
aborting at interpreter exit). Not in CI: 50 rounds take about an hour on 2 cores.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FIT = '''
import lightning as L, torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

class M(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Linear(8, 1)
    def training_step(self, batch, i):
        return nn.functional.mse_loss(self.net(batch[0]), batch[1])
    def validation_step(self, batch, i):
        self.log("val", nn.functional.mse_loss(self.net(batch[0]), batch[1]), sync_dist=True)
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

def data(n):
    x = torch.randn(n, 8, generator=torch.Generator().manual_seed(0))
    return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)

if __name__ == "__main__":
    L.seed_everything(0, verbose=False)
    trainer = L.Trainer(max_steps=6, val_check_interval=3, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(M(), data(64), data(32))
'''
GLOO_EXIT = '''
import os, sys
import torch, torch.distributed as dist, torch.multiprocessing as mp

def rank(r, world, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=r, world_size=world)
    out = [torch.empty(1) for _ in range(world)]
    dist.all_gather(out, torch.tensor([float(r)]))
    if os.environ.get("DESTROY") == "1":
        dist.destroy_process_group()

if __name__ == "__main__":
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [mp.get_context("spawn").Process(target=rank, args=(r, 5, port)) for r in range(5)]
    [p.start() for p in procs]
    [p.join() for p in procs]
    sys.exit(0 if all(p.exitcode == 0 for p in procs) else 1)
'''
SIGNS = ("terminate called", "Segmentation fault", "Connection closed by peer", "Connection reset by peer",
         "Traceback (most recent call last)")


def commands(script: Path) -> dict[str, list[str]]:
    sprite = [str(Path(sys.executable).parent / "sprite"), "run", "--devices", "2"]
    gloo = [sys.executable, str(script.with_name("gloo_exit.py"))]
    return {
        "torch gloo x5, no destroy": ["env", "DESTROY=0", *gloo],
        "torch gloo x5, destroy": ["env", "DESTROY=1", *gloo],
        "sprite local": [*sprite, "--launcher", "local", str(script)],
        "sprite mpiexec (hydra)": [*sprite, "--launcher", "mpiexec", "--mpi", "hydra", str(script)],
        "torchrun (no sprite)": [sys.executable, "-m", "torch.distributed.run", "--standalone",
                                 "--nproc-per-node", "2", str(script)],
    }


def failure_kind(output: str) -> str:
    return next((sign for sign in SIGNS if sign in output), "other")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--keep", help="folder to keep the output of failed runs in")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="finish-stress-"))
    script = work / "fit_with_validation.py"
    script.write_text(FIT)
    script.with_name("gloo_exit.py").write_text(GLOO_EXIT)
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    results = {name: collections.Counter() for name in commands(script)}
    started = time.monotonic()
    for run in range(1, args.runs + 1):
        for name, cmd in commands(script).items():  # interleaved, so load changes hit every launcher alike
            done = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=600)
            if done.returncode != 0:
                kind = failure_kind(done.stdout + done.stderr)
                results[name][kind] += 1
                if args.keep:
                    Path(args.keep).mkdir(parents=True, exist_ok=True)
                    slug = re.sub(r"[^a-z0-9]+", "-", name)
                    (Path(args.keep) / f"{slug}-{run}.log").write_text(done.stdout + done.stderr)
        print(f"after {run} round(s), {time.monotonic() - started:.0f} s: "
              + "; ".join(f"{name} {sum(c.values())} failed" for name, c in results.items()), flush=True)
    print(f"\n{args.runs} consecutive runs per row (sprite and torchrun rows: 2-rank fits with validation):")
    for name, counts in results.items():
        kinds = ", ".join(f"{kind}: {n}" for kind, n in counts.most_common()) or "-"
        print(f"  {name:26s} failures {sum(counts.values()):3d} / {args.runs}   ({kinds})")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
