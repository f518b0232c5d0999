"""A Lightning Fabric script with no arguments to Fabric: trains a small model a few steps, each rank writes what
its world looked like and a digest of the full weights.

    python any_fabric.py OUT_DIR
"""

import hashlib
import json
import os
import sys
from pathlib import Path

import lightning as L
import torch
from torch import nn

out = Path(sys.argv[1])
fabric = L.Fabric()
fabric.launch()
fabric.seed_everything(7 + fabric.global_rank)  # different starts: only the strategy's broadcast makes them agree
model = fabric.setup_module(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)))
optimizer = fabric.setup_optimizers(torch.optim.SGD(model.parameters(), lr=0.1))
for step in range(3):
    x = torch.randn(4, 8, device=fabric.device)
    loss = model(x).pow(2).mean()
    fabric.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
digest = hashlib.sha256()
for name, p in sorted(model.state_dict().items()):
    full = p.full_tensor() if hasattr(p, "full_tensor") else p
    digest.update(full.detach().cpu().numpy().tobytes())
record = {"strategy": type(fabric.strategy).__name__, "world": fabric.world_size, "rank": fabric.global_rank,
          "node_rank": fabric.node_rank, "local_rank": fabric.local_rank,
          "num_nodes": getattr(fabric.strategy, "num_nodes", 1),  # a single-device strategy has none
          "environment": type(getattr(fabric.strategy, "cluster_environment", None)).__name__,
          "digest": digest.hexdigest(),
          "pid": os.getpid(), "precision": type(fabric.strategy.precision).__name__, "device": str(fabric.device),
          "autocast": getattr(fabric.strategy.precision, "device", None)}
(out / f"fabric{fabric.global_rank}.json").write_text(json.dumps(record))
