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
