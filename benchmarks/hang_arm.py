"""What the hang diagnosis costs a training step (issue 27), against a baseline measured in the same run.

Three arms, each its own process, interleaved over ``--repeats`` rounds; every process starts sprite's heartbeat
as a launched rank does (beats.start) and trains a small MLP in a plain loop on a 1-rank gloo group (backward,
one all_reduce of the gradients, SGD step, ``sprite.beat``):

  heartbeat   the heartbeat alone (no SPRITE_STACKS_AFTER, TORCH_FR_BUFFER_SIZE=0): the baseline
  armed       + the stack dump armed and re-armed by its thread (SPRITE_STACKS_AFTER), recorder off
  recorder    + torch's flight recorder on (TORCH_FR_BUFFER_SIZE=2000), as sprite's plan sets it

The heartbeat interval is 0.05 s (the shortest the runtime accepts), so the dump is re-armed 20 times a second:
the worst case. Also printed: one faulthandler.dump_traceback_later call, timed alone.

    python benchmarks/hang_arm.py [--repeats 5] [--steps 2000]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ARMS = ("heartbeat", "armed", "recorder")


def worker(arm: str, steps: int, blocks: int) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn

    from sprite.runtime import beats

    run = os.environ["SPRITE_RUN_DIR"]
    os.makedirs(os.path.join(run, "heartbeat", "attempt-1"))
    os.makedirs(os.path.join(run, "stacks", "attempt-1"))
    beats.start(os.environ, 0)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=0, world_size=1, init_method="file://" + os.path.join(run, "store"))
    model = nn.Sequential(nn.Linear(64, 256), nn.Tanh(), nn.Linear(256, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    x, y = torch.randn(32, 64), torch.randn(32, 1)
    per_block = []
    for block in range(blocks + 1):  # block 0 is warm-up
        start = time.perf_counter()
        for step in range(steps):
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            flat = torch.cat([p.grad.flatten() for p in model.parameters()])
            dist.all_reduce(flat)
            opt.step()
            beats.beat(block * steps + step)
        if block:
            per_block.append((time.perf_counter() - start) / steps)
    dist.destroy_process_group()
    print(json.dumps({"step_s": per_block}))


def run_arm(arm: str, steps: int, blocks: int) -> list[float]:
    with tempfile.TemporaryDirectory() as run:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SPRITE_", "MASTER_", "TORCH_FR", "RANK"))}
        env.update({"SPRITE_RUN_DIR": run, "SPRITE_ATTEMPT": "1", "SPRITE_HEARTBEAT_SECONDS": "0.05",
                    "TORCH_FR_BUFFER_SIZE": "2000" if arm == "recorder" else "0"})
        if arm != "heartbeat":
            env["SPRITE_STACKS_AFTER"] = "600,600,600"
        out = subprocess.run([sys.executable, __file__, "--worker", arm, "--steps", str(steps), "--blocks",
                              str(blocks)], env=env, capture_output=True, text=True, check=True)
        return json.loads(out.stdout.strip().splitlines()[-1])["step_s"]


def rearm_cost(calls: int = 20000) -> float:
    import faulthandler

    with tempfile.TemporaryFile() as sink:
        start = time.perf_counter()
        for _ in range(calls):
            faulthandler.dump_traceback_later(600, file=sink.fileno())
        faulthandler.cancel_dump_traceback_later()
        return (time.perf_counter() - start) / calls


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--worker")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--blocks", type=int, default=3)
    a = p.parse_args()
    if a.worker:
        worker(a.worker, a.steps, a.blocks)
        return
    times: dict[str, list[float]] = {arm: [] for arm in ARMS}
    for _ in range(a.repeats):
        for arm in ARMS:
            times[arm] += run_arm(arm, a.steps, a.blocks)
    base = statistics.median(times["heartbeat"])
    print(f"{'arm':<10} {'median ms/step':>15} {'min':>8} {'max':>8} {'ratio':>7}   ({a.repeats} rounds x {a.blocks} "
          f"blocks of {a.steps} steps, arms interleaved)")
    for arm in ARMS:
        median = statistics.median(times[arm])
        print(f"{arm:<10} {median * 1e3:>15.4f} {min(times[arm]) * 1e3:>8.4f} {max(times[arm]) * 1e3:>8.4f} "
              f"{median / base:>7.3f}")
    print(f"one faulthandler.dump_traceback_later call: {rearm_cost() * 1e6:.2f} us")


if __name__ == "__main__":
    main()
