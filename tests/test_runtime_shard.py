"""shard_model and the FSDP2 trainable check, in this process on a one-rank gloo group (a FileStore, no env vars)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from sprite import shard_model
from sprite.errors import UsageError
from sprite.runtime.fsdp2 import _auto_shard, unmanaged_trainables


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(4, 4)


class HFLike(nn.Module):
    _no_split_modules = ["Block"]

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(4, 2)


@pytest.fixture(scope="module")
def mesh(tmp_path_factory):
    store = dist.FileStore(str(tmp_path_factory.mktemp("pg") / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield init_device_mesh("cpu", (1,))
    dist.destroy_process_group()


def test_blocks_bottom_up_then_root(mesh):
    model = shard_model(HFLike(), mesh)
    assert isinstance(model, FSDPModule) and all(isinstance(b, FSDPModule) for b in model.blocks)
    assert not isinstance(model.head, FSDPModule)  # owned by the root
    assert all(isinstance(p, DTensor) for p in model.parameters())
    assert unmanaged_trainables(model) == []


def test_idempotent(mesh):
    model = shard_model(HFLike(), mesh)
    states = [id(torch.distributed.fsdp.fully_shard.state(m)) for m in (model, *model.blocks)]
    assert shard_model(model, mesh) is model
    assert states == [id(torch.distributed.fsdp.fully_shard.state(m)) for m in (model, *model.blocks)]


def test_no_block_class_is_a_clear_error(mesh):
    with pytest.raises(UsageError, match="no block class in Sequential.*layer_classes="):
        shard_model(nn.Sequential(nn.Linear(2, 2)), mesh)
    with pytest.raises(UsageError, match="no module of class Block"):
        shard_model(nn.Sequential(nn.Linear(2, 2)), mesh, layer_classes=(Block,))


def test_unmanaged_trainables_are_named_and_frozen_ones_ignored(mesh):
    outer = nn.Module()
    outer.body = shard_model(HFLike(), mesh)
    outer.loose = nn.Linear(2, 2)
    outer.frozen = nn.Linear(2, 2).requires_grad_(False)
    assert unmanaged_trainables(outer) == ["loose.weight", "loose.bias"]


def test_auto_shard_shards_each_trainable_child(mesh):
    outer = nn.Module()
    outer.net = nn.Sequential(nn.Linear(2, 2), nn.Tanh())
    outer.frozen = nn.Linear(2, 2).requires_grad_(False)
    _auto_shard(outer, mesh)
    assert isinstance(outer.net, FSDPModule) and not isinstance(outer.frozen, FSDPModule)
    assert unmanaged_trainables(outer) == []


def test_hugging_face_decoder_blocks(mesh):
    transformers = pytest.importorskip("transformers")
    config = transformers.Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=256)
    model = shard_model(transformers.Qwen2ForCausalLM(config), mesh)
    layers = model.model.layers
    assert all(isinstance(layer, FSDPModule) for layer in layers) and isinstance(model, FSDPModule)
    assert unmanaged_trainables(model) == []
    model(torch.randint(0, 256, (1, 8))).logits.sum().backward()


def test_a_script_that_shards_nothing_gets_each_hugging_face_block_sharded(mesh):
    """docs/runtime.md: where the script shards nothing, sprite shards each Hugging Face block (the model's
    _no_split_modules), then each trainable child of the LightningModule; nothing trainable is left unmanaged."""
    transformers = pytest.importorskip("transformers")
    config = transformers.Qwen2Config(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, vocab_size=256)
    outer = nn.Module()
    outer.backbone = transformers.Qwen2ForCausalLM(config)
    outer.head = nn.Linear(64, 2)
    _auto_shard(outer, mesh)
    assert all(isinstance(layer, FSDPModule) for layer in outer.backbone.model.layers)
    assert isinstance(outer.backbone, FSDPModule) and isinstance(outer.head, FSDPModule)
    assert unmanaged_trainables(outer) == []


def _trained(mesh):
    model = shard_model(nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 2)), mesh, layer_classes=(nn.Linear,))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.ones(1, 4)).sum().backward()
    optimizer.step()
    return model, optimizer


def test_a_sharded_saves_state_dicts_hold_the_models_own_tensors_and_a_full_save_keeps_lightnings(mesh, monkeypatch):
    """FSDP2Strategy.lightning_module_state_dict / optimizer_state: a sharded save asks torch for the shards where
    they are (cpu_offload=False; Lightning's ModelParallelStrategy asks for a blocking copy of each to the host),
    so sprite's stager copies them once, queued; a full-state save keeps Lightning's own options."""
    import torch.distributed.checkpoint.state_dict as torch_state_dict

    from sprite.runtime.fsdp2 import FSDP2Strategy

    asked = []
    for name in ("get_model_state_dict", "get_optimizer_state_dict"):
        real = getattr(torch_state_dict, name)
        monkeypatch.setattr(torch_state_dict, name,
                            lambda *a, real=real, name=name, **k: asked.append((name, k["options"])) or real(*a, **k))
    model, optimizer = _trained(mesh)
    sharded = FSDP2Strategy()
    sharded.model = model
    state, optim = sharded.lightning_module_state_dict(), sharded.optimizer_state(optimizer)
    assert [(name, o.cpu_offload, o.full_state_dict) for name, o in asked] == [
        ("get_model_state_dict", False, False), ("get_optimizer_state_dict", False, False)]
    own = dict(model.named_parameters())
    assert sorted(state) == sorted(own)
    assert all(state[key].to_local().data_ptr() == own[key].to_local().data_ptr() for key in own)
    moments = {key: optimizer.state[own[key]]["exp_avg"] for key in own}
    assert all(optim["state"][key]["exp_avg"].to_local().data_ptr() == moments[key].to_local().data_ptr()
               for key in own)
    asked.clear()
    full = FSDP2Strategy(save_distributed_checkpoint=False)
    full.model = model
    full.lightning_module_state_dict()
    full.optimizer_state(optimizer)
    assert [(o.cpu_offload, o.full_state_dict) for _, o in asked] == [(True, True), (True, True)]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (run on the H200s)")
def test_a_sharded_saves_state_dicts_stay_on_the_gpu(tmp_path):
    """On CUDA, where Lightning's options would copy every shard to the host in the save call."""
    import subprocess
    import sys

    script = f"""
import torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch import nn
from sprite import shard_model
from sprite.runtime.fsdp2 import FSDP2Strategy
dist.init_process_group("cpu:gloo,cuda:nccl", init_method="file://{tmp_path}/store", rank=0, world_size=1)
torch.cuda.set_device(0)
model = shard_model(nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 2)).cuda(), init_device_mesh("cuda", (1,)),
                    layer_classes=(nn.Linear,))
optimizer = torch.optim.Adam(model.parameters())
model(torch.ones(1, 4, device="cuda")).sum().backward()
optimizer.step()
strategy = FSDP2Strategy()
strategy.model = model
state, optim = strategy.lightning_module_state_dict(), strategy.optimizer_state(optimizer)
kinds = {{v.device.type for v in state.values()}} | {{t.device.type for s in optim["state"].values()
                                                    for k, t in s.items() if k != "step"}}
print("KINDS", sorted(kinds))
dist.destroy_process_group()
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "KINDS ['cuda']" in done.stdout
