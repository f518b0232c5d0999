"""What one arm may leave behind in a warm pool process, and putting it back before the next arm.

A pool rank (pool_worker.py) takes a ``Snapshot`` once, before its first arm, and calls ``reset`` after every
arm: RNG states and the environment are always put back (an arm is entitled to change them); a changed global
default (dtype, TF32 and cuDNN flags, matmul precision, deterministic algorithms, grad mode, thread count) or a
module-global hook is put back and named; what cannot be put back here (a process group still alive, device
memory still held) is named as a leak, and the harness stops using that pool: the rest run in fresh processes.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import random
import sys

import torch

# (name, read, write) of the process-wide defaults an arm may change (ref32 turns TF32 off, for one).
_FLAGS = (
    ("default dtype", torch.get_default_dtype, torch.set_default_dtype),
    ("cuda.matmul.allow_tf32", lambda: torch.backends.cuda.matmul.allow_tf32,
     lambda v: setattr(torch.backends.cuda.matmul, "allow_tf32", v)),
    ("cudnn.allow_tf32", lambda: torch.backends.cudnn.allow_tf32,
     lambda v: setattr(torch.backends.cudnn, "allow_tf32", v)),
    ("cudnn.deterministic", lambda: torch.backends.cudnn.deterministic,
     lambda v: setattr(torch.backends.cudnn, "deterministic", v)),
    ("cudnn.benchmark", lambda: torch.backends.cudnn.benchmark,
     lambda v: setattr(torch.backends.cudnn, "benchmark", v)),
    ("float32 matmul precision", torch.get_float32_matmul_precision, torch.set_float32_matmul_precision),
    ("deterministic algorithms", torch.are_deterministic_algorithms_enabled, torch.use_deterministic_algorithms),
    ("grad mode", torch.is_grad_enabled, torch.set_grad_enabled),
    ("threads", torch.get_num_threads, torch.set_num_threads),
)
_HOOKS = ("_global_forward_hooks", "_global_forward_pre_hooks", "_global_backward_hooks",
          "_global_backward_pre_hooks", "_global_module_registration_hooks", "_global_parameter_registration_hooks",
          "_global_buffer_registration_hooks")


def _device_module():
    for name in ("cuda", "xpu"):
        module = getattr(torch, name, None)
        if module is not None and module.is_available() and module.is_initialized():
            return module
    return None


@dataclasses.dataclass
class Snapshot:
    flags: dict
    hooks: dict
    env: dict
    torch_rng: torch.Tensor
    python_rng: tuple
    numpy_rng: tuple | None
    device_rng: list | None
    device_bytes: int


def capture() -> Snapshot:
    """The process state a fresh rank starts its arm with."""
    from torch.nn.modules import module as nn_module

    numpy = sys.modules.get("numpy")
    device = _device_module()
    return Snapshot(
        flags={name: read() for name, read, _ in _FLAGS},
        hooks={name: set(getattr(nn_module, name, {})) for name in _HOOKS},
        env=dict(os.environ), torch_rng=torch.get_rng_state(), python_rng=random.getstate(),
        numpy_rng=numpy.random.get_state() if numpy is not None else None,
        device_rng=device.get_rng_state_all() if device is not None else None,
        device_bytes=device.memory_allocated() if device is not None else 0,
    )


def restore_rng(base: Snapshot) -> None:
    """Seeds every generator as it was in ``base`` (a fresh process's states)."""
    torch.set_rng_state(base.torch_rng)
    random.setstate(base.python_rng)
    numpy = sys.modules.get("numpy")
    if numpy is not None and base.numpy_rng is not None:
        numpy.random.set_state(base.numpy_rng)
    device = _device_module()
    if device is not None and base.device_rng is not None:
        device.set_rng_state_all(base.device_rng)


def reset(base: Snapshot) -> tuple[list[str], list[str]]:
    """Puts back what an arm changed. Returns (what was changed and put back, leaks that could not be)."""
    from torch.nn.modules import module as nn_module

    changed, leaks = [], []
    for name, read, write in _FLAGS:
        if read() != base.flags[name]:
            changed.append(f"{name} {read()} -> {base.flags[name]}")
            write(base.flags[name])
    for name in _HOOKS:
        table = getattr(nn_module, name, {})
        for key in set(table) - base.hooks[name]:
            changed.append(f"torch.nn {name[1:]} hook removed")
            del table[key]
    if dict(os.environ) != base.env:
        os.environ.clear()
        os.environ.update(base.env)
    restore_rng(base)
    gc.collect()
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        leaks.append("a process group is still alive")
    device = _device_module()
    if device is not None:
        device.empty_cache()
        if device.memory_allocated() > base.device_bytes:
            leaks.append(f"{device.memory_allocated() - base.device_bytes} bytes of device memory still held")
    return changed, leaks
