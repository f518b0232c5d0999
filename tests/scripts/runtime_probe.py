"""A plain Lightning script for sprite's runtime tests: only Trainer(max_steps=...) unless a flag says otherwise.

Each rank writes OUT/rank<N>.json with what the tests check: the world the Trainer ran, per-step losses, the
trainable parameters after the fit (full values, gathered when sharded) and how they are stored, the dtype of
every Linear output seen inside training_step, and the post-clip gradient norm of each step.
"""

import argparse
import json
import os
import sys

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class ClipProbeSGD(torch.optim.SGD):
    """SGD that records the global gradient norm it is about to apply (after Lightning's clipping)."""

    def __init__(self, params, lr, sink):
        super().__init__(params, lr=lr)
        self.sink = sink

    def step(self, closure=None):
        loss = closure() if closure is not None else None
        grads = [p.grad for g in self.param_groups for p in g["params"] if p.grad is not None]
        full = [g.full_tensor() if hasattr(g, "full_tensor") else g for g in grads]
        self.sink.append(float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in full]))))
        super().step()
        return loss


class Probe(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 1))
        self.losses, self.norms, self.linear_dtypes = [], [], set()
        for m in self.net:
            if isinstance(m, nn.Linear):
                m.register_forward_hook(lambda mod, inp, out: self.linear_dtypes.add(str(out.dtype)))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x).float(), y)
        self.losses.append(float(loss.detach()))
        return loss

    def configure_optimizers(self):
        return ClipProbeSGD(self.parameters(), 0.1, self.norms)


def describe(model):
    """Per trainable parameter: full value (gathered), storage kind, local and global shapes."""
    out = {}
    for name, p in model.named_parameters():
        sharded = hasattr(p, "full_tensor")
        full = p.full_tensor() if sharded else p.data
        out[name] = {
            "value": full.detach().float().flatten().tolist(),
            "dtensor": sharded,
            "placements": [str(pl) for pl in p.placements] if sharded else [],
            "local_numel": (p.to_local() if sharded else p).numel(),
            "numel": full.numel(),
        }
    return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--max-steps", type=int, default=4)
    parser.add_argument("--clip", type=float, help="Trainer(gradient_clip_val=CLIP)")
    parser.add_argument("--precision", help="Trainer(precision=...)")
    parser.add_argument("--accelerator-instance", action="store_true", help="Trainer(accelerator=CPUAccelerator())")
    parser.add_argument("--devices", type=int, help="Trainer(devices=...)")
    args = parser.parse_args()

    extra = {}
    if args.clip is not None:
        extra["gradient_clip_val"] = args.clip
    if args.precision:
        extra["precision"] = args.precision
    if args.accelerator_instance:
        extra["accelerator"] = L.pytorch.accelerators.CPUAccelerator()
    if args.devices is not None:
        extra["devices"] = args.devices

    L.seed_everything(0, verbose=False)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(64, 8, generator=gen)
    data = TensorDataset(x, x.sum(dim=1, keepdim=True).sin())
    model = Probe()
    trainer = L.Trainer(max_steps=args.max_steps, **extra)
    trainer.fit(model, DataLoader(data, batch_size=8))

    report = {
        "rank": trainer.global_rank,
        "world_size": trainer.world_size,
        "strategy": type(trainer.strategy).__name__,
        "environment": type(getattr(trainer.strategy, "cluster_environment", None)).__name__,
        "precision_plugin": type(trainer.precision_plugin).__name__,
        "mpi_started": "mpi4py.MPI" in sys.modules,
        "losses": model.losses,
        "norms": model.norms,
        "linear_dtypes": sorted(model.linear_dtypes),
        "params": describe(model),
    }
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"rank{trainer.global_rank}.json"), "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main()
