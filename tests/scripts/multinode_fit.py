"""Two simulated nodes: a plain torch.distributed all_reduce, then a Lightning fit in the same world.

    python multinode_fit.py OUT_DIR

The plain part joins through env:// (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from sprite's runtime) and records
the standard variables; the Trainer (no arguments about the world) then reuses that process group (Lightning 2.6.6
fabric/utilities/distributed.py _init_dist_connection returns early when one exists). Each rank writes
OUT/node<RANK>.json.
"""

import hashlib
import json
import os
import sys
from pathlib import Path

import lightning as L
import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

out = Path(sys.argv[1])
record = {name: os.environ.get(name) for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                                                  "NODE_RANK", "GROUP_RANK", "MASTER_ADDR")}
dist.init_process_group("gloo")
total = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(total)
record["sum"] = total.item()


class Net(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


L.seed_everything(int(os.environ["RANK"]), verbose=False)  # different starts: the strategy must make one model
x = torch.randn(32, 4, generator=torch.Generator().manual_seed(0))
model = Net()
trainer = L.Trainer(max_steps=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False)
trainer.fit(model, DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4))
digest = hashlib.sha256()
for name, p in sorted(model.named_parameters()):
    digest.update((p.full_tensor() if hasattr(p, "full_tensor") else p).detach().numpy().tobytes())
record.update(node_rank=trainer.node_rank, local_rank=trainer.local_rank, num_nodes=trainer.num_nodes,
              world=trainer.world_size, strategy=type(trainer.strategy).__name__, digest=digest.hexdigest())
(out / f"node{trainer.global_rank}.json").write_text(json.dumps(record))
