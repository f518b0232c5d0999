"""How sprite writes a torch.distributed.checkpoint folder: torch's own ``FileSystemWriter`` and ``dcp.async_save``.

sprite writes no archive format of its own (it did until issue 26; tests/data/dcp_v1 keeps a folder of that
format, which sprite's reader still loads). The writer is torch's, with two public options set:
- ``sync_files=False``: sprite fsyncs every rank's files itself on its background thread, then seals
  (``sprite.runtime.ckpt.seal``); torch's own fsync would run file by file inside the write.
- ``thread_count``: a rank's shards are spread over :func:`threads` files written in parallel.
Each item is a ``torch.save`` record written without its CRC-32 (``torch.serialization.set_crc32_options``,
:func:`no_crc32`): ``torch.load`` does not need it, and sprite's manifest covers every byte with SHA-256. That
setting is per thread (torch 2.13 torch/utils/_config_module.py keeps overrides in a ContextVar), so
:class:`Writer` sets it in the thread that runs ``write_data``; the further threads torch starts there when
``thread_count`` > 1 still compute it. The files are hashed after the write, from the page cache, on the
background thread (``sprite.integrity.digest``).

Save plans are cached (torch's public ``DefaultSavePlanner(enable_plan_caching=True)``): a save whose plan equals the
one before skips the planning collective's pickling and unpickling of every item's plan, Python work that, on a
background thread, competes for the GIL with the training loop (caching took 42% off the GIL time of torch's executor
thread on one H200, docs/runs/h200-2026-12-03). torch keys the cache by the planner's class name, so :func:`planner`
makes a class of its own for each process group this process joins (:func:`new_group`: a warm pool's next role, with
another world, never meets the plans of the one before) and for each layout of the state (:func:`planner`: torch's
test of an unchanged plan ignores dtypes). The caches of layouts no longer saved stay in torch's class-level dicts (one
save's plans each), one per layout a process has saved. Process mode takes torch's default planner (a class
made here could not be sent to torch's process).

:func:`mode` picks torch's async checkpointer, ``sprite run --checkpoint-writer`` (``MODE`` without it): "thread"
(a thread of this rank) or "process" (a process torch starts, which keeps the write's Python work off the training
loop's GIL); benchmarks/checkpoint_io.py measures both. Both
stage with sprite's own stager (``sprite.runtime.ckpt.stage.stager``: host buffers kept from save to save, shared
memory in process mode, device copies queued on a side stream instead of waited for). torch's ``DefaultStager``,
which process mode would stage with, cannot be used for a second save in torch 2.11 ("KeyError: <class 'type'>" in
_state_dict_stager.py, pytorch/pytorch#183413: its ``_stage`` closes the stager). Every save gets a writer of its
own. On one H200 (docs/runs/h200-2026-12-03) process mode's step-time ratio was
1.19x and 1.41x in two runs (the second waited for saves that outlasted the 10 steps between them) against thread
mode's 1.38-1.43x, and equal (1.29x) at a larger batch. On another host (docs/runs/h200-2026-12-03-f) it was
1.23x against 1.51x, and thread mode's steps begun with no save in flight ran 6-12% slower than a fit without saves
while process mode's did not; on two more hosts (docs/runs/h200-2026-12-03-g) that split did not reproduce (process
1.28x against thread 1.42x on one; thread mode without a lasting cost on the other), and the fits without saves
varied 25% on one host; at a save every 30 steps process mode ran 1.18x and 1.13x against thread's 1.28x (one pair
each). "thread" stays the default until process mode's lead holds over more pairs and hosts, since its buffers
take the state's size in shared memory.
"""

from __future__ import annotations

import contextlib
import os

import torch
from torch.distributed.checkpoint import FileSystemWriter

from sprite import contract
from sprite.errors import UsageError, one_line

MODE = "thread"  # torch's AsyncCheckpointerType: "thread" or "process", where SPRITE_CHECKPOINT_WRITER is unset
MAX_THREADS = 4  # files a rank writes in parallel at most


def mode(env=os.environ) -> str:
    """Where this save is written: ``SPRITE_CHECKPOINT_WRITER`` (``sprite run --checkpoint-writer``), else ``MODE``.
    Raises UsageError for another value (the launcher checks it; a hand-set one could still be wrong)."""
    chosen = env.get(contract.CHECKPOINT_WRITER, "").strip() or MODE
    if chosen not in contract.CHECKPOINT_WRITERS:
        raise UsageError(f"{contract.CHECKPOINT_WRITER}={one_line(chosen, 80)!r} is not a checkpoint writer.",
                         "It says where a sharded save is written; sprite run sets it from --checkpoint-writer.",
                         f"Use one of {', '.join(contract.CHECKPOINT_WRITERS)}, or unset it.")
    return chosen


def threads() -> int:
    """Files each rank writes in parallel: the cores this rank may use, shared with the other ranks of its node."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    local = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    return max(1, min(MAX_THREADS, cores // local))


_planner: dict = {}  # {"key": (process group generation, layout digest), "class": the planner class}
_generation = [0]


def planner(state: dict):
    """A save planner for ``state``: torch's default one, caching plans (module docstring), under a cache key of
    this process group and of ``state``'s layout. torch 2.11-2.13 decide that a plan is unchanged from the items'
    names, sizes and chunks alone (``planner_helpers._compare_save_plans``), not their dtypes: a state whose dtype
    changed would be saved with the metadata of the save before (seen: a float16 tensor recorded as float32). The
    key therefore carries every tensor's name, dtype, layout, shape and requires_grad."""
    from torch.distributed.checkpoint import DefaultSavePlanner

    key = (_generation[0], layout_digest(state))
    if _planner.get("key") != key:
        name = f"SpriteSavePlanner_{key[0]}_{key[1]}"
        _planner.update(key=key, cls=type(name, (DefaultSavePlanner,), {}))
    return _planner["cls"](enable_plan_caching=True)


def layout_digest(state) -> str:
    """A short digest of every tensor's place, dtype, layout, shape and requires_grad in ``state``."""
    import hashlib

    parts: list[str] = []

    def walk(value, path: str) -> None:
        if isinstance(value, torch.Tensor):
            parts.append(f"{path}|{value.dtype}|{value.layout}|{tuple(value.shape)}|{value.requires_grad}")
        elif isinstance(value, dict):
            for name, item in value.items():
                walk(item, f"{path}.{name}")
        elif isinstance(value, (list, tuple)):
            for number, item in enumerate(value):
                walk(item, f"{path}[{number}]")
        elif hasattr(value, "state_dict") and callable(value.state_dict):  # a Stateful, as dcp.save takes it
            walk(value.state_dict(), path)

    walk(state, "")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def new_group() -> None:
    """This process's process group ended: the next save plans afresh under a cache key of its own."""
    _planner.clear()
    _generation[0] += 1


class Writer(FileSystemWriter):
    """torch's FileSystemWriter, writing its items without CRC-32 (module docstring)."""

    def write_data(self, plan, planner):
        with no_crc32():
            return super().write_data(plan, planner)


def writer(path) -> FileSystemWriter:
    """torch's writer for a folder sprite has just created (module docstring)."""
    import logging

    from sprite.runtime.ckpt.torch_names import DCP_LOGGER

    quiet = logging.getLogger(DCP_LOGGER)
    if quiet.level == logging.DEBUG:  # torch's own setting: records built per staged item and dropped
        quiet.setLevel(logging.INFO)
    return Writer(path, single_file_per_rank=True, sync_files=False, thread_count=threads())


@contextlib.contextmanager
def no_crc32():
    """``torch.save`` in this thread writes no CRC-32 inside the block (the setting before it comes back after)."""
    from torch.serialization import get_crc32_options, set_crc32_options

    before = get_crc32_options()
    set_crc32_options(False)
    try:
        yield
    finally:
        set_crc32_options(before)
