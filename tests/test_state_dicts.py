"""A sharded save's state dicts (sprite.runtime.ckpt.state_dicts) against torch's get_model_state_dict and
get_optimizer_state_dict, and the stager's copy of their DTensors, in this process on a one-rank gloo group (a
FileStore, no env vars)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint.state_dict as torch_sd
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions
from torch.distributed.device_mesh import init_device_mesh

from sprite import shard_model
from sprite.runtime.ckpt import state_dicts
from sprite.runtime.fsdp2 import FSDP2Strategy

SHARDED = FSDP2Strategy.sharded_state_dict_options()


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = nn.Linear(4, 4)
        self.register_buffer("seen", torch.zeros(2))

    def forward(self, x):
        return self.inner(x)


class Net(nn.Module):
    _no_split_modules = ["Block"]

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([Block(), Block()])
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


class Copying(Net):
    """A model whose state_dict() hands out copies: torch's state dict is then not the model's own tensors."""

    def state_dict(self, *args, **kwargs):
        return {key: value.clone() for key, value in super().state_dict(*args, **kwargs).items()}


@pytest.fixture(scope="module")
def mesh(tmp_path_factory):
    store = dist.FileStore(str(tmp_path_factory.mktemp("pg") / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield init_device_mesh("cpu", (1,))
    dist.destroy_process_group()


def _trained(mesh, cls=Net, steps: int = 2):
    model = shard_model(cls(), mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.01)
    for _ in range(steps):
        model(torch.ones(3, 4)).sum().backward()
        optimizer.step()
    return model, optimizer


def _step(model, optimizer):
    model(torch.ones(3, 4)).sum().backward()
    optimizer.step()


def _assert_like_torch(model, optimizer, got_model: dict, got_optim: dict) -> None:
    """Equal to what torch's functions return now: the same keys and order, the same storages and values."""
    want_model = torch_sd.get_model_state_dict(model, options=SHARDED)
    want_optim = torch_sd.get_optimizer_state_dict(model, optimizer, options=SHARDED)
    assert list(got_model) == list(want_model)
    assert all(state_dicts._same(got_model[key], want_model[key]) for key in want_model)
    assert list(got_optim) == list(want_optim) == ["state", "param_groups"]
    assert list(got_optim["state"]) == list(want_optim["state"])
    for fqn, per_param in want_optim["state"].items():
        assert list(got_optim["state"][fqn]) == list(per_param)
        assert all(torch.equal(got_optim["state"][fqn][k], v) for k, v in per_param.items())
    assert len(got_optim["param_groups"]) == len(want_optim["param_groups"])
    for got, want in zip(got_optim["param_groups"], want_optim["param_groups"]):
        assert got == want  # the FQNs and every hyperparameter


def _no_torch(monkeypatch):
    for name in ("get_model_state_dict", "get_optimizer_state_dict"):
        monkeypatch.setattr(torch_sd, name, lambda *a, _name=name, **k: pytest.fail(f"{_name} was called"))


def test_after_the_first_save_the_state_dicts_equal_torchs_without_calling_it(mesh, monkeypatch):
    model, optimizer = _trained(mesh)
    first = state_dicts.model_state(model, SHARDED), state_dicts.optimizer_state(model, optimizer, SHARDED)
    _assert_like_torch(model, optimizer, *first)
    assert any(key.startswith("blocks.0.inner.") for key in first[1]["state"])  # FQNs, not positions
    _step(model, optimizer)  # the values move; the fast path must hand out the new ones
    with monkeypatch.context() as patched:
        _no_torch(patched)
        later = state_dicts.model_state(model, SHARDED), state_dicts.optimizer_state(model, optimizer, SHARDED)
    _assert_like_torch(model, optimizer, *later)
    model.head.register_buffer("scale", torch.ones(1))  # the model's keys changed: torch is asked again
    calls = []
    real = torch_sd.get_model_state_dict
    monkeypatch.setattr(torch_sd, "get_model_state_dict", lambda *a, **k: calls.append(1) or real(*a, **k))
    assert "head.scale" in state_dicts.model_state(model, SHARDED) and calls == [1]


def test_an_optimizer_without_state_yet_gets_torchs_first_step_then_the_fast_path(mesh, monkeypatch):
    model, optimizer = _trained(mesh, steps=0)
    assert not optimizer.state
    state_dicts.model_state(model, SHARDED)
    got = state_dicts.optimizer_state(model, optimizer, SHARDED)
    assert len(got["state"]) == len(list(model.parameters()))  # torch made the state (a step with zero grads)
    with monkeypatch.context() as patched:
        _no_torch(patched)
        got = state_dicts.model_state(model, SHARDED), state_dicts.optimizer_state(model, optimizer, SHARDED)
    _assert_like_torch(model, optimizer, *got)


def test_an_optimizer_given_new_parameters_or_losing_state_goes_back_to_torch(mesh, monkeypatch):
    model, optimizer = _trained(mesh)
    extra = shard_model(Net(), mesh)
    state_dicts.optimizer_state(model, optimizer, SHARDED)
    calls = []
    real = torch_sd.get_optimizer_state_dict
    monkeypatch.setattr(torch_sd, "get_optimizer_state_dict", lambda *a, **k: calls.append(1) or real(*a, **k))
    optimizer.add_param_group({"params": list(extra.head.parameters()), "lr": 0.5})
    wrapper = nn.Module()
    wrapper.main, wrapper.extra = model, extra
    # the optimizer's parameters are now named within the wrapper; torch is asked, and the result agrees with it
    got = state_dicts.optimizer_state(wrapper, optimizer, SHARDED)
    assert calls == [1] and [g["lr"] for g in got["param_groups"]] == [0.01, 0.5]
    assert got["param_groups"][1]["params"] == ["extra.head.weight", "extra.head.bias"]
    optimizer.state.clear()  # e.g. a load that reset it: what the names rest on changed, torch is asked
    got = state_dicts.optimizer_state(wrapper, optimizer, SHARDED)
    assert calls == [1, 1] and got["state"] == {}
    _step(model, optimizer)
    state_dicts.optimizer_state(wrapper, optimizer, SHARDED)  # learnt again
    assert len(calls) == 3
    block = model.blocks[0]
    block.renamed = block.inner  # the same parameters under new names: torch is asked, and its names are given
    del block.inner
    got = state_dicts.optimizer_state(wrapper, optimizer, SHARDED)
    assert len(calls) == 4 and "main.blocks.0.renamed.weight" in got["state"]
    assert not any(".inner." in fqn and fqn.startswith("main.blocks.0.") for fqn in got["state"])
    block.inner = block.renamed  # as it was, so the model runs again
    del block.renamed
    _step(model, optimizer)
    state_dicts.optimizer_state(wrapper, optimizer, SHARDED)
    assert len(calls) == 5
    other = nn.Module()
    other.main, other.extra = model, extra
    state_dicts.optimizer_state(other, optimizer, SHARDED)  # another model object: asked again
    assert len(calls) == 6
    state_dicts.optimizer_state(other, optimizer, SHARDED)
    assert len(calls) == 6


def test_a_model_whose_state_dict_copies_always_goes_to_torch(mesh, monkeypatch):
    model, optimizer = _trained(mesh, cls=Copying)
    state_dicts.model_state(model, SHARDED)
    assert state_dicts._models[model] is None  # torch's tensors are not the model's state_dict()'s: not learnt
    calls = []
    real = torch_sd.get_model_state_dict
    monkeypatch.setattr(torch_sd, "get_model_state_dict", lambda *a, **k: calls.append(1) or real(*a, **k))
    state_dicts.model_state(model, SHARDED)
    state_dicts.model_state(model, SHARDED)
    assert calls == [1, 1]


def test_other_options_are_torchs_every_time_and_learn_nothing(mesh, monkeypatch):
    model, optimizer = _trained(mesh)
    calls = []
    for name in ("get_model_state_dict", "get_optimizer_state_dict"):
        real = getattr(torch_sd, name)
        monkeypatch.setattr(torch_sd, name, lambda *a, _real=real, **k: calls.append(1) or _real(*a, **k))
    offload = StateDictOptions(cpu_offload=True)
    for _ in range(2):
        got = state_dicts.model_state(model, offload)
        state_dicts.optimizer_state(model, optimizer, offload)
    assert calls == [1] * 4 and model not in state_dicts._models and optimizer not in state_dicts._optimizers
    assert all(value.device.type == "cpu" for value in got.values())


def test_the_stager_copies_a_saves_dtensors_without_their_detach_and_keeps_their_buffers(mesh, monkeypatch):
    """What the save call does next with these dicts (stage.HostCopy.queue): a DTensor's detach is dispatched through
    DTensor's operator machinery (0.05 s of a 0.3 s save call on CPU), so the stager, under no_grad, takes its local
    tensor instead; parameters that require grad come out as plain host copies, the same buffers save after save."""
    from torch.distributed.tensor import DTensor

    from sprite.runtime.ckpt import stage

    model, optimizer = _trained(mesh)
    host = stage.HostCopy()
    params = dict(model.named_parameters())  # DTensor Parameters, requiring grad
    monkeypatch.setattr(DTensor, "detach", lambda self: pytest.fail("a DTensor was detached"))
    first, _ = host.queue(params)
    _step(model, optimizer)
    second, _ = host.queue(params)
    for name, param in params.items():
        assert isinstance(second[name], DTensor) and not second[name].requires_grad
        assert torch.equal(second[name].to_local(), param.to_local().detach())
        assert second[name].to_local().data_ptr() == first[name].to_local().data_ptr()
    host.release()
