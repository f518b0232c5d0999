"""A plain torch.distributed script (no Lightning): env:// rendezvous, one all_reduce, each rank writes what it saw.

    python any_plain.py OUT_DIR [--alone] [--kill-on NODE]

--alone never calls init_process_group (sprite must report the one-process worlds). --kill-on NODE: in the first
attempt of a run, local rank 0 on Slurm node NODE dies of SIGKILL at once (a node fault for sprite's recovery).
"""

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

out = Path(sys.argv[1])
seen = {name: os.environ.get(name) for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK",
                                                "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT", "SLURMD_NODENAME")}
if "--kill-on" in sys.argv and os.environ.get("SPRITE_ATTEMPT") == "1" and seen["LOCAL_RANK"] == "0" \
        and os.environ.get("SLURMD_NODENAME") == sys.argv[sys.argv.index("--kill-on") + 1]:
    import signal

    os.kill(os.getpid(), signal.SIGKILL)
if "--alone" in sys.argv:
    print("alone: done", flush=True)
    sys.exit(0)
dist.init_process_group("gloo")  # env:// from RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
value = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(value)
seen.update(sum=value.item(), rank=dist.get_rank(), world=dist.get_world_size(),
            lightning_imported="lightning.pytorch" in sys.modules,
            warm_served=bool(getattr(sys.modules.get("sprite.contract.warm"), "SERVED", False)))
(out / f"plain{dist.get_rank()}.json").write_text(json.dumps(seen))
dist.destroy_process_group()
