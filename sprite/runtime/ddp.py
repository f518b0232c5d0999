"""``XPUDDPStrategy``: Lightning's DDP with the backend and stream taken from the device table.

Lightning 2.6.6 builds the DDP wrapper inside ``torch.cuda.stream(torch.cuda.Stream())`` whenever device_ids is set
(pytorch/strategies/ddp.py:194), which raises without CUDA. The backend comes from sprite's device table, the
same row the accelerator and precision use.
"""

from __future__ import annotations

from lightning.pytorch.strategies import DDPStrategy
from torch.nn.parallel import DistributedDataParallel

from sprite.runtime.devices import backend_for


class XPUDDPStrategy(DDPStrategy):
    """DDP for any device in sprite's device table (xpu -> xccl, cuda -> nccl, cpu -> gloo)."""

    strategy_name = "xpu_ddp"

    def _setup_model(self, model):
        if self.root_device.type == "cuda":
            return super()._setup_model(model)
        # No CUDA stream off CUDA: Lightning 2.6.6 pytorch/strategies/ddp.py:194 calls torch.cuda.stream here.
        device_ids = self.determine_ddp_device_ids()
        return DistributedDataParallel(module=model, device_ids=device_ids, **self._ddp_kwargs)

    def _get_process_group_backend(self) -> str:
        return self._process_group_backend or backend_for(self.root_device)

    @classmethod
    def register_strategies(cls, strategy_registry) -> None:
        strategy_registry.register(cls.strategy_name, cls, description=cls.__doc__, override=True)
