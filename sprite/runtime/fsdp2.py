"""``FSDP2Strategy``: plain FSDP2 data parallelism on Lightning's ModelParallelStrategy.

Differences from ModelParallelStrategy (Lightning 2.6.6 pytorch/strategies/model_parallel.py):
- the mesh defaults to data parallel over every process (Lightning's "auto" is tensor parallel within a node);
- a model that nobody sharded is sharded with :func:`shard_model` semantics (see ``_auto_shard``), so a plain
  Lightning script runs under ``SPRITE_STRATEGY=fsdp`` unchanged;
- before fit, every trainable parameter must be managed by a ``fully_shard`` module, else its gradient would never
  be averaged across ranks (a DTensor from tensor parallelism alone is not enough);
- under an external launcher the launched process count must equal devices x num_nodes (Lightning checks
  this only for DDP);
- the process-group backend comes from sprite's device table;
- a 1-device or DDP checkpoint file resumes even when the optimizer holds only the trainable parameters (LoRA),
  which Lightning refuses with "Missing optimizer state" (see ``fsdp2_load``);
- a sharded save's state dicts hold the model's and the optimizer's own tensors, where they live
  (:meth:`sharded_state_dict_options`), not a copy on the host, and after the first save are built from the
  model's and the optimizer's ``state_dict()`` where torch's were seen to be just those (``ckpt.state_dicts``).
"""

from __future__ import annotations

import os
import types
from pathlib import Path

import torch
from lightning.fabric.plugins.environments import LightningEnvironment
from lightning.pytorch.strategies import ModelParallelStrategy
from lightning.pytorch.utilities.model_helpers import is_overridden
from torch import nn
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor

from sprite.errors import UsageError
from sprite.runtime.ckpt import fsdp2_load, state_dicts
from sprite.runtime.devices import backend_for
from sprite.runtime.shard import block_classes, shard_model


def unmanaged_trainables(module: nn.Module) -> list[str]:
    """Names of trainable parameters that no ``fully_shard`` module manages (or that are not DTensors)."""
    managed: set[int] = set()
    for sub in module.modules():
        if isinstance(sub, FSDPModule):
            managed.update(id(p) for p in sub.parameters())
    return [
        name
        for name, p in module.named_parameters()
        if p.requires_grad and (id(p) not in managed or not isinstance(p, DTensor))
    ]


def _auto_shard(module: nn.Module, mesh) -> None:
    """Shard a model its script did not shard: HF blocks bottom-up, then each child of the LightningModule.

    The LightningModule itself is not made a root: Lightning calls training_step, not forward, so a root's
    unshard hook would never run. Parameters held directly by the LightningModule stay unmanaged and are named
    by the check in ``setup``.
    """
    if block_classes(module):
        for child in module.children():
            if block_classes(child):
                shard_model(child, mesh)
    for child in module.children():
        if not isinstance(child, FSDPModule) and any(p.requires_grad for p in child.parameters()):
            fully_shard(child, mesh=mesh)


class FSDP2Strategy(ModelParallelStrategy):
    """FSDP2 (``fully_shard``) over all processes; pass ``data_parallel_size``/``tensor_parallel_size`` for 2D."""

    strategy_name = "fsdp2"

    @staticmethod
    def sharded_state_dict_options():
        """torch's state-dict options of a sharded save: every rank's own shards, left where they are.

        Lightning's ModelParallelStrategy asks for ``cpu_offload=True`` (Lightning 2.6.6
        pytorch/strategies/model_parallel.py:261, 281), which on an accelerator copies every shard into new
        pageable host memory, one blocking copy a tensor, in the training loop at every save; sprite's save then
        copies that again into its own host buffers. Left on the device, the state reaches sprite's stager, which
        queues one copy into its pinned buffers and lets training go on (``sprite.runtime.ckpt.stage``); a save
        outside sprite's seal goes to ``dcp.save``, which copies device tensors itself."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions

        return StateDictOptions(full_state_dict=False, cpu_offload=False)

    def __init__(self, data_parallel_size="auto", tensor_parallel_size=1, **kwargs) -> None:
        super().__init__(data_parallel_size, tensor_parallel_size, **kwargs)

    def setup_environment(self) -> None:
        """Raises UsageError when an external launcher started another number of processes than devices x nodes."""
        self._check_launched_world()
        if self._data_parallel_size == "auto":
            self._data_parallel_size = self.num_nodes * self.num_processes // int(self._tensor_parallel_size)
        module = self.lightning_module
        if module is not None and not is_overridden("configure_model", module):
            module.configure_model = types.MethodType(lambda m: _auto_shard(m, m.device_mesh["data_parallel"]), module)
        super().setup_environment()

    def setup(self, trainer) -> None:
        """Raises UsageError naming every trainable parameter that no fully_shard module manages."""
        module = self.lightning_module
        if not any(isinstance(m, FSDPModule) for m in module.modules()):
            _auto_shard(module, self.device_mesh["data_parallel"])
        unmanaged = unmanaged_trainables(module)
        if unmanaged:
            raise UsageError(
                f"Trainable parameter(s) not managed by fully_shard: {', '.join(unmanaged)}.",
                "Their gradients would never be averaged across ranks; being a DTensor is not enough.",
                "Shard the module that holds them in configure_model (shard_model(...) on a module containing"
                " every trainable part, task heads included), or freeze them.",
            )
        super().setup(trainer)

    def _check_launched_world(self) -> None:
        env = self.cluster_environment
        if env is None or not env.creates_processes_externally:
            return
        # LightningEnvironment.world_size() is 1 until Lightning sets it (Lightning 2.6.6
        # fabric/plugins/environments/lightning.py:44), so the launched count comes from WORLD_SIZE.
        if type(env) is LightningEnvironment:
            if "WORLD_SIZE" not in os.environ:
                return
            launched = int(os.environ["WORLD_SIZE"])
        else:
            launched = env.world_size()
        wanted = self.num_nodes * self.num_processes
        if launched != wanted:
            raise UsageError(
                f"The launcher started {launched} processes but FSDP2Strategy expects devices x num_nodes ="
                f" {self.num_processes} x {self.num_nodes} = {wanted}.",
                "The Trainer's devices or num_nodes differ from the launch.",
                "Set devices to the ranks per node and num_nodes to the node count of the launch.",
            )

    def load_checkpoint(self, checkpoint_path, weights_only=None) -> dict:
        """Lightning's load, except a full-state file saved on 1 device or by DDP: its optimizer state is keyed by
        position, which Lightning maps through every model parameter and so fails for LoRA (see fsdp2_load).

        Raises UsageError when such a file's optimizer holds another number of parameters than this one.
        """
        from lightning.fabric.strategies.fsdp import _is_full_checkpoint

        path = Path(self.broadcast(checkpoint_path))
        if not _is_full_checkpoint(path) or not self.optimizers:
            return super().load_checkpoint(path, weights_only=weights_only)
        checkpoint = torch.load(path, mmap=True, map_location="cpu", weights_only=weights_only)
        if not fsdp2_load.positional(checkpoint):
            return super().load_checkpoint(path, weights_only=weights_only)
        return fsdp2_load.restore(self.model, self.optimizers, checkpoint, self.lightning_module.strict_loading)

    def lightning_module_state_dict(self) -> dict:
        """Lightning's, except a sharded save's: the model's own shards (:meth:`sharded_state_dict_options`,
        ``ckpt.state_dicts``)."""
        if not self._save_distributed_checkpoint:
            return super().lightning_module_state_dict()
        return state_dicts.model_state(self.model, self.sharded_state_dict_options())

    def optimizer_state(self, optimizer) -> dict:
        """Lightning's, except a sharded save's: the optimizer's own state (:meth:`sharded_state_dict_options`,
        ``ckpt.state_dicts``)."""
        if not self._save_distributed_checkpoint:
            return super().optimizer_state(optimizer)
        from lightning.pytorch.core.optimizer import LightningOptimizer

        if isinstance(optimizer, LightningOptimizer):
            optimizer = optimizer.optimizer
        return state_dicts.optimizer_state(self.model, optimizer, self.sharded_state_dict_options())

    def _get_process_group_backend(self) -> str:
        return self._process_group_backend or backend_for(self.root_device)

    @classmethod
    def register_strategies(cls, strategy_registry) -> None:
        strategy_registry.register(cls.strategy_name, cls, description=cls.__doc__, override=True)
