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

:func:`mode` picks torch's async checkpointer: ``sprite run --checkpoint-writer`` where given, "thread" (a thread
of this rank) or "process" (a process torch starts, which keeps the write's Python work off the training loop's
GIL). Without it, :func:`default_mode` picks at a process group's first sharded save, and every rank takes the same
pick (:func:`agree`: the modes plan on different groups, so ranks that differ would hang): "process" where the
state is on CUDA and ``/dev/shm`` has room for the node's ranks' buffers, else "thread" (a rank that lacks the room
says so in one line). A process whose first process group ended (a warm pool's next role) takes "thread": torch
starts one checkpoint process per Python process, joined to the world of the group it was started in. A given
"process" is held to the room and to the first group too (:func:`default_mode`'s ``chosen``, :data:`LATER_ROLE`).
torch's checkpoint processes join the run's rendezvous store (:func:`prefix_store`) rather than a port picked for them.
Process mode is measured better on CUDA: with a device-bound 0.54 s step and a save every 10 steps on one H200
(docs/runs/h200-2026-12-04), 1.042x, 1.052x and 1.054x the fit without saves on two hosts,
against thread mode's 1.107x and 1.095x; the fits without saves agreed within 0.1%, and thread mode's extra time was
its slower steps beside the background thread (2.1-2.2 s over 6 saves against process mode's 0.3-0.5 s). At a
0.2 s step bound by Python dispatch process mode led on most of 5 hosts too (1.13-1.28x against 1.28-1.51x,
docs/runs/h200-2026-12-03, -f and -g). On XPU and CPU nothing measured favours it, and it starts a process per
rank, so "thread" stays theirs. Both
stage with sprite's own stager (``sprite.runtime.ckpt.stage.stager``: host buffers kept from save to save, shared
memory in process mode, device copies queued on a side stream instead of waited for). torch's ``DefaultStager``,
which process mode would stage with, cannot be used for a second save in torch 2.11 ("KeyError: <class 'type'>" in
_state_dict_stager.py, pytorch/pytorch#183413: its ``_stage`` closes the stager). Every save gets a writer of its
own.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading

import torch
from torch.distributed.checkpoint import FileSystemWriter

from sprite import contract
from sprite.errors import UsageError, one_line

MAX_THREADS = 4  # files a rank writes in parallel at most
SHM = "/dev/shm"  # where torch's shared CPU tensors live (its file_descriptor sharing strategy, shm_open)
SHM_SPARE = 1.25  # process mode is picked only where /dev/shm's free space is this many times the node's buffers

_picked: list = []  # [the writer default_mode and agree picked at this process group's first sharded save]


def mode(env=os.environ, state=None, group=None) -> str:
    """Where this process's sharded saves are written: the pick made at this process group's first save, made now
    from ``state`` on every rank of ``group`` when there is none yet (module docstring); before any save,
    ``SPRITE_CHECKPOINT_WRITER`` (``sprite run --checkpoint-writer``) or "thread", unremembered. The variable's
    "thread" is taken outright; its "process" still needs the room in /dev/shm and a first process group, and
    falls back to "thread" with one line where either lacks. Raises UsageError for another value (the launcher
    checks it; a hand-set one could still be wrong)."""
    chosen = env.get(contract.CHECKPOINT_WRITER, "").strip()
    if chosen and chosen not in contract.CHECKPOINT_WRITERS:
        raise UsageError(f"{contract.CHECKPOINT_WRITER}={one_line(chosen, 80)!r} is not a checkpoint writer.",
                         "It says where a sharded save is written; sprite run sets it from --checkpoint-writer.",
                         f"Use one of {', '.join(contract.CHECKPOINT_WRITERS)}, or unset it.")
    if _picked:
        return _picked[0]
    if state is None or chosen == "thread":
        return chosen or "thread"
    if _generation[0]:  # torch keeps one checkpoint process per Python process, joined to its first group's world
        pick, why = "thread", (LATER_ROLE if chosen else "")
    else:
        devices, nbytes = set(), 0
        for _path, tensor in _leaves(state, ""):
            local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
            devices.add(local.device.type)
            nbytes += local.numel() * local.element_size()
        from sprite.integrity.digest import local_ranks

        pick, why = default_mode(devices, nbytes, local_ranks(env), shm_free(), chosen)
    if why:
        from sprite.runtime import trail

        trail.say(why)
    _picked.append(agree(pick, group))
    return _picked[0]


LATER_ROLE = ("--checkpoint-writer process is not taken in this warm pool's later role: torch starts one checkpoint "
              "process per Python process, joined to the first role's world; sharded saves are written in a thread "
              "of each rank instead. Launch the run outside the pool to write in torch's process.")


def default_mode(devices: set, nbytes: int, local_ranks: int, free: int | None, chosen: str = "") -> tuple[str, str]:
    """``(writer, why)`` for a rank whose sharded state holds ``nbytes`` on ``devices`` (device types), beside
    ``local_ranks`` ranks of its node (itself included), with ``free`` bytes free in /dev/shm (None: no /dev/shm).
    "process" on CUDA (or wherever ``chosen`` is "process") with room for every local rank's buffers and a quarter
    spare: torch's process stages in shared memory, and pages written past tmpfs's room kill the rank with SIGBUS.
    Else "thread", with ``why`` a one-line reason where only the room stood in the way."""
    if chosen != "process" and "cuda" not in devices:
        return "thread", ""
    need = nbytes * local_ranks
    if free is not None and free >= need * SHM_SPARE:
        return "process", ""
    have = "no /dev/shm" if free is None else f"{free / 2**30:.1f} GiB free in {SHM}"
    asked = "--checkpoint-writer process is not taken: " if chosen else ""
    return "thread", (f"{asked}sharded saves are written in a thread of each rank, not in torch's checkpoint process: "
                      f"{have}, and that process's host buffers need {need * SHM_SPARE / 2**30:.1f} GiB on this "
                      f"node ({local_ranks} rank(s) x {nbytes / 2**30:.1f} GiB of state, a quarter spare). Give the "
                      f"job a larger {SHM}, or pass --checkpoint-writer thread to choose this writer outright.")


def prefix_store(env=os.environ) -> None:
    """Before a process-mode save: torch's checkpoint processes join the run's own store
    (``torch_names.DCP_PREFIX_STORE``), where ``MASTER_ADDR`` and ``MASTER_PORT`` name it (Lightning's process group
    rendezvoused there; torch asserts on both) and the variable is not set already (a value the user set stays)."""
    from sprite.runtime.ckpt.torch_names import DCP_PREFIX_STORE

    if env.get(contract.MASTER_ADDR) and env.get(contract.MASTER_PORT, "").isdigit():
        env.setdefault(DCP_PREFIX_STORE, "1")


def shm_free() -> int | None:
    """Bytes an unprivileged process may still take in /dev/shm, or None where there is none."""
    try:
        info = os.statvfs(SHM)
    except OSError:
        return None
    return info.f_bavail * info.f_frsize


def agree(pick: str, group) -> str:
    """The writer every rank of ``group`` takes: "process" only where every rank picked it (a collective: every
    rank calls it at the same save). ``group`` None: this rank's own pick."""
    import torch.distributed as dist

    if group is None or not dist.is_initialized() or dist.get_world_size(group) == 1:
        return pick
    votes = torch.tensor([1 if pick == "process" else 0], dtype=torch.int32)
    dist.all_reduce(votes, op=dist.ReduceOp.MIN, group=group)
    return "process" if int(votes.item()) else "thread"


def threads() -> int:
    """Files each rank writes in parallel: the cores this rank may use, shared with the other ranks of its node
    (``sprite.integrity.digest.rank_cores``), at most ``MAX_THREADS``."""
    from sprite.integrity.digest import rank_cores

    return min(MAX_THREADS, rank_cores())


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

    parts = [f"{path}|{value.dtype}|{value.layout}|{tuple(value.shape)}|{value.requires_grad}"
             for path, value in _leaves(state, "")]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def _leaves(value, path: str):
    """``(path, tensor)`` for every tensor in ``value``: dicts, lists, tuples and Statefuls, as dcp.save walks them."""
    if isinstance(value, torch.Tensor):
        yield path, value
    elif isinstance(value, dict):
        for name, item in value.items():
            yield from _leaves(item, f"{path}.{name}")
    elif isinstance(value, (list, tuple)):
        for number, item in enumerate(value):
            yield from _leaves(item, f"{path}[{number}]")
    elif hasattr(value, "state_dict") and callable(value.state_dict):  # a Stateful, as dcp.save takes it
        yield from _leaves(value.state_dict(), path)


def new_group() -> None:
    """This process's process group ended: the next save plans afresh under a cache key of its own."""
    _planner.clear()
    _picked.clear()
    _generation[0] += 1


class Writer(FileSystemWriter):
    """torch's FileSystemWriter, writing its items without CRC-32 (module docstring), whose write fails whenever one
    of its items was not written (:meth:`write_data`)."""

    def write_data(self, plan, planner):
        """torch's write, with two of its failures made plain (both seen with torch 2.11-2.13 on a full disk):
        - When ``thread_count`` > 1, an exception in one of torch's further writing threads ends that thread alone
          (Python prints its traceback) and torch returns the other threads' results as a success, so ``finish``
          would record a checkpoint without that thread's items, which no reader can load. The results are
          checked against the plan's items here, and a shortfall fails the write, naming the thread's exception.
        - An ``OSError`` inside an item's ``torch.save`` (ENOSPC) reaches the caller as the zip writer's
          "unexpected pos N vs M", raised as torch's ``torch.save`` cleans up, with the OSError as its context;
          in process mode only the later exception crosses to the rank. The OSError is raised instead."""
        expected = {item.index for item in plan.items}
        with no_crc32(), _thread_failures() as failed:
            try:
                future = super().write_data(plan, planner)
            except Exception as err:
                cause = _os_error(err)
                if cause is err or cause is None:
                    raise
                # a new exception of the OSError's kind: raising that one itself would close a loop in the chain
                raise type(cause)(*cause.args) if cause.errno is None else type(cause)(
                    cause.errno, cause.strerror, cause.filename) from err
        if future.done():  # as torch 2.11-2.13 return it: the write is over
            _all_written(future.value(), expected, failed, self.path)
            return future
        return future.then(lambda done: _all_written(done.value(), expected, failed, self.path))

    def __setstate__(self, state: dict) -> None:
        """Where torch sends the writer at every save, its checkpoint process (process mode), it is unpickled here."""
        self.__dict__.update(state)
        quiet_checkpoint_process()


def _all_written(results: list, expected: set, failed: list, path) -> list:
    """``results`` when they hold a result for every item index in ``expected``; else raises OSError naming the
    first exception a writing thread ended with (``failed``), or where its traceback went."""
    missing = expected - {result.index for result in results}
    if not missing:
        return results
    error = failed[0] if failed else None
    why = (f"{type(error).__name__}: {one_line(str(error), 200)}" if error is not None
           else "the thread's traceback is in this rank's output")
    raise OSError(getattr(error, "errno", None) or errno.EIO,
                  f"one of torch's writing threads failed ({why}): only {len(expected) - len(missing)} of "
                  f"{len(expected)} items of this rank's part of {path} were written")


def _os_error(err: BaseException) -> BaseException | None:
    """``err`` if it is an OSError, else the first OSError among the exceptions it was raised from or while
    handling (``__cause__``, ``__context__``), else None."""
    seen = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, OSError):
            return err
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return None


_failed_threads: list = []  # [(the list a write in progress collects into, the threads alive as it began)]
_hook_lock = threading.Lock()


@contextlib.contextmanager
def _thread_failures():
    """Collects, into the list yielded, the exceptions that end threads started inside the block (torch's further
    writing threads), through ``threading.excepthook`` (installed once; the hook before it still runs)."""
    global _previous_hook
    failed: list = []
    entry = (failed, set(threading.enumerate()))
    with _hook_lock:
        if threading.excepthook is not _note_thread_failure:
            _previous_hook, threading.excepthook = threading.excepthook, _note_thread_failure
        _failed_threads.append(entry)
    try:
        yield failed
    finally:
        with _hook_lock:
            _failed_threads[:] = [kept for kept in _failed_threads if kept is not entry]


_previous_hook = threading.excepthook


def _note_thread_failure(args) -> None:
    with _hook_lock:
        for failed, before in _failed_threads:
            if args.thread is not None and args.thread not in before:
                failed.append(args.exc_value)
    _previous_hook(args)


def quiet_checkpoint_process() -> None:
    """Drops, in this process, the INFO lines torch's checkpoint process logs at every save ("Received async
    checkpoint request", "Completed checkpoint save request", "Waiting for checkpoint save request"): torch gives
    that process's root logger a handler at INFO with no public option to quiet it, so a save every 10 minutes for a
    week would write 3,000 lines into each rank's output. Its warnings and errors still pass, and so do the lines it
    logs as it starts, before the first save's writer reaches it. Only records from torch's module
    (``torch_names.DCP_PROCESS_MODULE``) are dropped; a rename there lets them through again."""
    import logging

    root = logging.getLogger()
    if not any(isinstance(kept, _PerSaveLines) for kept in root.filters):
        root.addFilter(_PerSaveLines())


class _PerSaveLines:
    """A logging filter: records below WARNING from torch's checkpoint process module are dropped."""

    def __init__(self):
        from sprite.runtime.ckpt.torch_names import DCP_PROCESS_MODULE

        self.source = os.path.join(*DCP_PROCESS_MODULE.split(".")) + ".py"

    def filter(self, record) -> bool:
        return record.levelno >= 30 or not record.pathname.endswith(self.source)  # 30: logging.WARNING


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
