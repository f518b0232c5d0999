"""A sharded save's state dicts: what torch's ``get_model_state_dict`` and ``get_optimizer_state_dict`` return,
built from the model's and the optimizer's own ``state_dict()`` once torch's result has been seen to be just that.

Those two functions take most of a save call in the training loop: 65-75% of a sharded save's 0.17-0.22 s on one
H200 (docs/runs/h200-2026-12-03-b), 0.15-0.25 s for the qwen2.5-0.5b-shape model's 484 parameters on CPU, most of
it their checks and fully qualified names (FQNs) walked afresh from the module tree at every call, while
``model.state_dict()`` and ``optimizer.state_dict()`` take 0.015-0.025 s. For an FSDP2 model torch's model state dict
*is* ``model.state_dict()`` (the same keys, the same shards), and its optimizer state dict is
``optimizer.state_dict()`` with each parameter's position replaced by its FQN.

So the first call for a model (or a model and an optimizer) calls torch's function and compares: the same keys in
the same order and every tensor the same storage (model); the same positions named the same way and every
parameter's state the same object (optimizer). Where it all agrees, later calls build the dict from
``state_dict()`` and the names learnt, as long as what they rest on is unchanged: the model's state-dict keys, the
optimizer's parameters (by identity) and how many of them hold state, and the model's parameters with their names
(4-5 ms to walk on CPU for that model, against torch's 0.07-0.13 s for the optimizer). Anything else (another
wrapper, state-dict hooks that rename or copy, an optimizer given new parameters, options other than a sharded
save's) goes to torch's function every time. Both paths are public torch APIs.
"""

from __future__ import annotations

import weakref
from itertools import chain

_models: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> its keys, or None: torch's always
_optimizers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # optimizer -> (model ref, its _Names) or None


def _sharded(options) -> bool:
    """Whether ``options`` (torch's StateDictOptions) ask for a sharded state dict left where it is."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return options == StateDictOptions(full_state_dict=False, cpu_offload=False)


def _local(value):
    return value.to_local() if hasattr(value, "to_local") else value


def _same(a, b) -> bool:
    """Whether two state-dict values are the same thing: tensors of one type and layout over the same storage."""
    import torch

    if not isinstance(a, torch.Tensor) or not isinstance(b, torch.Tensor):
        return a is b
    if type(a) is not type(b) or a.shape != b.shape or a.dtype != b.dtype:
        return False
    la, lb = _local(a), _local(b)
    return (la.device == lb.device and la.stride() == lb.stride() and la.storage_offset() == lb.storage_offset()
            and la.untyped_storage().data_ptr() == lb.untyped_storage().data_ptr())


def model_state(model, options) -> dict:
    """``get_model_state_dict(model, options=options)``, from ``model.state_dict()`` where that was seen equal."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    if not _sharded(options):
        return get_model_state_dict(model, options=options)
    keys = _models.get(model, False)
    if keys is None:
        return get_model_state_dict(model, options=options)
    raw = model.state_dict()
    if keys == tuple(raw):
        return raw
    ref = get_model_state_dict(model, options=options)
    agreed = list(ref) == list(raw) and all(_same(ref[key], raw[key]) for key in ref)
    _models[model] = tuple(raw) if agreed else None
    return ref


class _Names:
    """What an optimizer's fast path rests on: its parameters by identity, how many hold state, the model's
    parameters with their names (a module moved or renamed renames them), and the FQNs in the order of
    ``optimizer.state_dict()``'s positions."""

    def __init__(self, optimizer, model, fqns: list[str]):
        self.params = self.ids(optimizer)
        self.stateful = len(optimizer.state)
        self.named = self.names(model)
        self.fqns = fqns

    @staticmethod
    def ids(optimizer) -> tuple:
        return tuple(tuple(id(p) for p in group["params"]) for group in optimizer.param_groups)

    @staticmethod
    def names(model) -> tuple:
        return tuple((name, id(p)) for name, p in model.named_parameters())

    def hold(self, optimizer, model) -> bool:
        return (len(optimizer.state) == self.stateful and self.ids(optimizer) == self.params
                and self.names(model) == self.named)


def _named(raw: dict, fqns: list[str]) -> dict:
    """``optimizer.state_dict()`` keyed as torch's get_optimizer_state_dict keys it: positions replaced by FQNs."""
    return {"state": {fqns[pid]: value for pid, value in raw["state"].items()},
            "param_groups": [{**group, "params": [fqns[pid] for pid in group["params"]]}
                             for group in raw["param_groups"]]}


def _agrees(ref: dict, mine: dict) -> bool:
    if set(ref) != {"state", "param_groups"} or list(ref["state"]) != list(mine["state"]):
        return False
    if any(ref["state"][key] is not mine["state"][key] for key in ref["state"]):
        # torch's per-parameter dicts are the optimizer's own; a copy means something was converted
        return False
    if len(ref["param_groups"]) != len(mine["param_groups"]):
        return False
    return all(set(a) == set(b) and a["params"] == b["params"]
               for a, b in zip(ref["param_groups"], mine["param_groups"]))


def optimizer_state(model, optimizer, options) -> dict:
    """``get_optimizer_state_dict(model, optimizer, options=options)``, from ``optimizer.state_dict()`` and the
    FQNs torch gave its parameters where that was seen equal."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    if not _sharded(options):
        return get_optimizer_state_dict(model, optimizer, options=options)
    known = _optimizers.get(optimizer, False)
    if known:
        owner, names = known
        if owner() is model and names.hold(optimizer, model):
            return _named(optimizer.state_dict(), names.fqns)
    elif known is None:
        return get_optimizer_state_dict(model, optimizer, options=options)
    ref = get_optimizer_state_dict(model, optimizer, options=options)  # may make the state (torch's first step)
    raw = optimizer.state_dict()
    fqns = list(chain.from_iterable(group["params"] for group in ref.get("param_groups", ())))
    positions = list(chain.from_iterable(group["params"] for group in raw["param_groups"]))
    agreed = (positions == list(range(len(fqns))) and len(set(fqns)) == len(fqns)
              and all(isinstance(fqn, str) for fqn in fqns) and _agrees(ref, _named(raw, fqns)))
    _optimizers[optimizer] = (weakref.ref(model), _Names(optimizer, model, fqns)) if agreed else None
    return ref
