"""A Lightning script that shards only part of its model: FSDP2Strategy must refuse to fit it, naming the rest.

``extra`` is a plain trainable Linear outside fully_shard; ``replicated`` is a trainable DTensor (Replicate) that
no fully_shard module manages. ``net`` is sharded correctly and must not be named.
"""

import lightning as L
import torch
from torch import nn
from torch.distributed.tensor import Replicate, distribute_tensor
from torch.utils.data import DataLoader, TensorDataset

from sprite import shard_model


class HalfSharded(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 1))
        self.extra = nn.Linear(8, 1)

    def configure_model(self):
        mesh = self.device_mesh["data_parallel"]
        shard_model(self.net, mesh, layer_classes=(nn.Linear,))
        if not hasattr(self, "replicated"):
            self.replicated = nn.Parameter(distribute_tensor(torch.zeros(3), mesh, [Replicate()]))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return nn.functional.mse_loss(self.net(x) + self.extra(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


if __name__ == "__main__":
    x = torch.randn(32, 8)
    trainer = L.Trainer(max_steps=2)
    trainer.fit(HalfSharded(), DataLoader(TensorDataset(x, x[:, :1]), batch_size=8))
    print("FIT FINISHED", flush=True)
