"""Checkpoint save and load with sprite (background save on torch's public writer, SHA-256 manifest written last
after every rank's files are durable, verified load) against a synchronous plain torch.save + fsync and against
Lightning's own save of the same state, all measured in the same run.

The parity recipe's model (LoRA on a Qwen2 decoder; default qwen2.5-0.5b-shape) is sharded with FSDP2 over the
launched ranks and takes one AdamW step, so the state is what a LoRA checkpoint holds: every weight, frozen ones
included, and the adapter's optimizer state. Each sprite save runs what sprite's runtime runs for
``Trainer.save_checkpoint`` (sprite.runtime.ckpt.seal: the state staged off the device, then on the background
thread the write, hashes, fsyncs, gather and manifest), and is timed twice:
- stall: from the save call until the training loop may go on (the copy off the device; a wait for a previous
  save in flight would count too), against a synchronous plain torch.save of the same state (ratio target <= 0.25).
  The timing ends with a barrier, which on NCCL synchronises the loop's stream, so the figure includes the device
  copies even where they are queued (sprite.runtime.ckpt.stage; --wait-copies: each save waits for them);
- sealed: from the save call until the manifest is on disk on every rank, against plain torch.save + fsync (target
  <= 1.3).
Loads verify as `sprite run --resume` does (sprite.runtime.ckpt.shared_verify) and copy what they read into the
state's own tensors; timed from the page cache the save just filled (warm) and cold (files dropped from the page
cache first). Formats:
- sharded: a torch.distributed.checkpoint folder (dcp.async_save, torch's FileSystemWriter), one row per async
  mode (--modes: torch's "thread" and "process" checkpointers); load = sprite's reader (dcp_read.load). Plain
  baseline: each rank torch.save / torch.load of its own local shards. Lightning's own: dcp.save (fsyncs every
  file) / dcp.load.
- full state: the gathered state on rank 0, staged to host and written in the background by torch.save into a
  temporary name, fsynced, hashed, renamed, sealed; load = verify, then torch.load(mmap=True) as Lightning's FSDP
  strategies load it. Plain baseline: rank 0 torch.save / torch.load. Lightning's own: cloud_io._atomic_save (no
  fsync) / torch.load(mmap=True).
Then the step time: --steps optimizer steps of the recipe's model without checkpoints, and the same with a sprite
sharded save every --every steps (its stall and the background write's contention included), one device
synchronisation at each end (target <= 1.05), split into the waits for the save before, the time in the save
calls (staging), and the slower steps beside the background writes (with queued copies, the device's wait for
them falls there too). Each save's state dict is built as sprite's FSDP2Strategy builds a sharded save's (the
shards left on the device, from the model's and optimizer's state_dict() once torch's functions agreed with them;
--torch-state-dicts: torch's functions at every save; --lightning-offload: as Lightning's ModelParallelStrategy
does, every shard copied to the host in the save call). Process mode stages into views of one block of shared
memory (--buffer-per-tensor: a block each). A warm-up run with saves comes first: the first save of a run makes its
pinned buffers and gloo group, a cost a long run pays once; it is printed apart.
Times are medians over --repeats, baseline and sprite interleaved; each save goes to a new name. After the timings,
torch's own reader loads sprite's last sharded folder into a blank copy of the state, which must equal the state
saved (the run fails otherwise).

    python benchmarks/checkpoint_io.py [--model qwen2.5-0.5b-shape] [--devices 2] [--accelerator auto] [--repeats 3]
        [--modes thread,process] [--steps 40] [--every 10] [--batch 2] [--seq 8]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import statistics
import sys
import tempfile
import time


def _state(model_name: str, accelerator: str):
    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict
    from torch.distributed.device_mesh import init_device_mesh

    from sprite.parity import recipe
    from sprite.parity.settings import Settings
    from sprite.runtime.devices import backend_for, device_type
    from sprite.runtime.shard import shard_model

    kind = device_type(accelerator)
    local = int(os.environ.get("LOCAL_RANK", "0"))
    shared = kind.name != "cpu" and kind.module().device_count() < int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    device = torch.device(kind.name, local % kind.module().device_count()) if kind.name != "cpu" else \
        torch.device("cpu")
    if kind.name != "cpu":
        kind.module().set_device(device)  # NCCL's communicator takes the current device, not the model's
    # More ranks than devices: the ranks share them through gloo (NCCL refuses two ranks on one GPU; FACTS.md)
    dist.init_process_group("gloo" if shared else backend_for(device))
    _DEVICE[0] = f"{torch.cuda.get_device_name(device) if device.type == 'cuda' else device.type}" + \
        (f", {dist.get_world_size()} ranks sharing it through gloo" if shared else "")
    model = recipe.build_model(Settings(model=model_name, global_batch=2)).to(device)
    shard_model(model, init_device_mesh(device.type, (dist.get_world_size(),)))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
    recipe.row_loss(model, torch.zeros(2, 8, dtype=torch.long, device=device), torch.zeros(2, dtype=torch.long,
                                                                                           device=device)).backward()
    optimizer.step()
    return model, optimizer, get_model_state_dict, get_optimizer_state_dict


_DEVICE = ["cpu"]


def _timed(fn, clean: bool = False) -> float:
    """Seconds ``fn`` takes on the slowest rank; ``clean``: first write back every dirty page (os.sync), so that
    a save does not share the disk with the write-back of the save before it."""
    import torch.distributed as dist

    if clean:
        os.sync()
    dist.barrier()
    start = time.perf_counter()
    fn()
    dist.barrier()
    return time.perf_counter() - start


def _fsync(path: pathlib.Path) -> None:
    from sprite import integrity

    integrity.fsync_file(path)


def _cold(fn, *paths: pathlib.Path) -> float:
    """``_timed(fn)`` after every file under ``paths`` was fsynced and dropped from the page cache
    (posix_fadvise DONTNEED; no root needed), so the load reads the disk, as a resume on a fresh node does."""
    for path in paths:
        for name in [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file()):
            fd = os.open(name, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)
    return _timed(fn)


def _folder_bytes(path: pathlib.Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _background_save(state: dict, path: pathlib.Path, rank: int, world: int, folder: bool, writes: bool = True):
    """What sprite's runtime does for ``Trainer.save_checkpoint`` (sprite.runtime.ckpt.seal.save_checkpoint):
    wait for the save in flight, stage this rank's writes (``writes`` False: this rank writes nothing, as a
    full-state save's ranks but 0), and queue the background job that writes, hashes, fsyncs and seals."""
    import torch.distributed as dist

    from sprite.runtime.ckpt import background, durable
    from sprite.runtime.ckpt import save as hashed_save
    from sprite.runtime.ckpt import seal

    durable.wait()
    if folder and rank == 0:
        path.mkdir()
    if folder:
        dist.barrier()
    group = background.group()
    with hashed_save.collecting() as pending:
        if writes:
            (hashed_save.dcp_save if folder else hashed_save.atomic_save)(state, path)
    plan = {"write": str(path), "swap": False, "folder": folder}
    meta = {"step": 0, "bench": True}
    durable.later(lambda: seal._complete(plan, path, meta, pending, rank, world, group))


def _sealed() -> None:
    """Wait until this rank's background save is sealed (every rank calls it; _timed's barrier waits for all)."""
    from sprite.runtime.ckpt import durable

    assert durable.drain(600)
    durable.check()


def _into(dest, loaded) -> None:
    """Copy every tensor of ``loaded`` into the tensor at the same place in ``dest`` (a state of the same layout)."""
    import torch

    if isinstance(dest, torch.Tensor):
        dest.copy_(loaded)
    elif isinstance(dest, dict):
        for key, value in dest.items():
            _into(value, loaded[key])
    elif isinstance(dest, (list, tuple)):
        for value, got in zip(dest, loaded):
            _into(value, got)


def _like(state, make):
    """``state``'s layout in new containers, each tensor replaced by ``make(tensor)``, other values kept."""
    import torch

    if isinstance(state, torch.Tensor):
        return make(state)
    if isinstance(state, dict):
        return {key: _like(value, make) for key, value in state.items()}
    if isinstance(state, (list, tuple)):
        return [_like(value, make) for value in state]
    return state


def _sharded(root: pathlib.Path, state: dict, rank: int, repeat: int, mode: str) -> dict:
    """One repeat of the sharded format: sprite's background save and verified load, the per-rank plain baseline,
    Lightning's own dcp.save / dcp.load."""
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    from sprite.runtime.ckpt import dcp_read
    from sprite.runtime.ckpt import shared_verify

    folder = root / f"dcp-{mode}{repeat}"
    plain, bare = root / f"plain-{mode}{repeat}", root / f"bare-{mode}{repeat}"
    local = {key: {k: (v.to_local() if hasattr(v, "to_local") else v) for k, v in part.items()}
             for key, part in (("model", state["model"]), ("optim", _flat(state["optim"])))}
    world = dist.get_world_size()
    _writer(mode)

    def plain_save():
        if rank == 0:
            plain.mkdir()
        dist.barrier()
        torch.save(local, plain / f"rank{rank}.pt")

    def sprite_load():  # as `sprite run --resume` does: every rank hashes its share, the shard files while it loads
        pending = shared_verify.start(shared_verify.DefaultGroup(), folder, background=True)
        dcp_read.load(state, folder)
        assert pending.verdict().valid, "the sealed folder does not verify"

    def plain_load():  # into the model's own local shards, as dcp.load does
        _into(local, torch.load(plain / f"rank{rank}.pt", weights_only=True))

    def format_save():  # Lightning's own sharded save: dcp.save (fsyncs, sync_files=True), no manifest
        dcp.save(state, checkpoint_id=bare)

    times = {"plain_save": _timed(plain_save, clean=True),
             "plain_fsync": _timed(lambda: _fsync(plain / f"rank{rank}.pt")),
             "format_save": _timed(format_save, clean=True),
             "sprite_stall": _timed(lambda: _background_save(state, folder, rank, world, True), clean=True)}
    times["sprite_sealed"] = times["sprite_stall"] + _timed(_sealed)
    times.update(plain_load=_timed(plain_load), format_load=_timed(lambda: dcp.load(state, checkpoint_id=bare)),
                 sprite_load=_timed(sprite_load))
    times.update(plain_cold=_cold(plain_load, plain), format_cold=_cold(lambda: dcp.load(state, checkpoint_id=bare),
                                                                        bare), sprite_cold=_cold(sprite_load, folder))
    return {**times, "plain_bytes": _folder_bytes(plain) if rank == 0 else 0,
            "sprite_bytes": _folder_bytes(folder) if rank == 0 else 0}


def _check(root: pathlib.Path, state: dict, repeat: int, mode: str) -> bool:
    """Whether torch's own reader (dcp.load, FileSystemReader) loads sprite's sharded folder of ``repeat``, saved in
    ``mode``, into a blank copy of ``state`` equal to ``state``, on every rank."""
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    blank = _like(state, torch.zeros_like)  # new containers, so that nothing of ``state`` is loaded into
    dcp.load(blank, checkpoint_id=root / f"dcp-{mode}{repeat}")
    same = torch.tensor([float(_equal(blank, state))], device=_device(state))
    dist.all_reduce(same, op=dist.ReduceOp.MIN)
    return bool(same.item())


def _equal(got, want) -> bool:
    import torch

    if isinstance(want, torch.Tensor):
        local = lambda tensor: tensor.to_local() if hasattr(tensor, "to_local") else tensor  # noqa: E731
        return torch.equal(local(got), local(want))
    if isinstance(want, dict):
        return set(got) == set(want) and all(_equal(got[key], want[key]) for key in want)
    if isinstance(want, (list, tuple)):
        return len(got) == len(want) and all(_equal(a, b) for a, b in zip(got, want))
    return got == want


def _device(state):
    import torch

    if isinstance(state, torch.Tensor):
        return state.device
    values = state.values() if isinstance(state, dict) else state if isinstance(state, (list, tuple)) else []
    return next((found for found in map(_device, values) if found is not None), None)


def _flat(optim: dict) -> dict:
    """An optimizer state dict's tensors as one flat name -> tensor mapping."""
    return {f"{name}/{key}": value for name, entry in optim["state"].items() for key, value in entry.items()}


def _full(root: pathlib.Path, state: dict, rank: int, repeat: int) -> dict:
    """One repeat of the full-state format on rank 0: sprite's background save and seal, verified load; the
    plain baseline; Lightning's own write and load."""
    import torch
    import torch.distributed as dist

    from sprite import integrity

    from lightning.fabric.utilities.cloud_io import _atomic_save

    path, plain, bare = root / f"full{repeat}.ckpt", root / f"full{repeat}.plain.ckpt", root / f"full{repeat}.bare"
    dest = _like(state, torch.empty_like) if rank == 0 else None  # where a load puts the state: the model's tensors
    world = dist.get_world_size()

    def plain_save():
        if rank == 0:
            torch.save(state, plain)

    def sprite_load():  # verify, then Lightning's load of an FSDP full-state file: torch.load(mmap=True)
        if rank == 0:
            assert integrity.verify(path).valid, "the sealed file does not verify"
            _into(dest, torch.load(path, weights_only=True, mmap=True))

    def plain_load():
        if rank == 0:
            _into(dest, torch.load(plain, weights_only=True))

    def format_load():  # the format without sprite: Lightning's mmap load, no verification
        if rank == 0:
            _into(dest, torch.load(bare, weights_only=True, mmap=True))

    def format_save():  # the format without sprite: Lightning's own write (cloud_io._atomic_save), no fsync
        if rank == 0:
            _atomic_save(state, bare)

    times = {"plain_save": _timed(plain_save, clean=True),
             "plain_fsync": _timed(lambda: _fsync(plain) if rank == 0 else None),
             "format_save": _timed(format_save, clean=True),
             "sprite_stall": _timed(lambda: _background_save(state, path, rank, world, False, rank == 0), clean=True)}
    times["sprite_sealed"] = times["sprite_stall"] + _timed(_sealed)
    times.update(plain_load=_timed(plain_load), format_load=_timed(format_load), sprite_load=_timed(sprite_load))
    times.update(plain_cold=_cold(plain_load, plain), format_cold=_cold(format_load, bare),
                 sprite_cold=_cold(sprite_load, path))
    return {**times, "plain_bytes": plain.stat().st_size if rank == 0 else 0,
            "sprite_bytes": path.stat().st_size if rank == 0 else 0}


def _first_saves(root: pathlib.Path, sharded: dict, full: dict | None, modes: list[str], rank: int) -> dict:
    """The stall of each format's first background save, measured apart: it makes the pinned host buffers that
    later saves reuse (and the saves' gloo group), a cost a long run pays once; the repeats measure the saves
    after it, as a run's every later checkpoint."""
    import torch.distributed as dist

    world, first = dist.get_world_size(), {}
    for mode in modes:
        _writer(mode)
        first[f"sharded ({mode})"] = _timed(
            lambda: _background_save(sharded, root / f"first-{mode}", rank, world, True), clean=True)
        _timed(_sealed)
    if full:
        first["full state"] = _timed(
            lambda: _background_save(full, root / "first-full.ckpt", rank, world, False, rank == 0), clean=True)
        _timed(_sealed)
    return first


def _steps(model, optimizer, args, root: pathlib.Path, state_of, every: int) -> dict:
    """Seconds for ``args.steps`` optimizer steps of the recipe's model (one synchronisation at each end), with a
    sprite sharded save every ``every`` steps (0: none), on the slowest rank: ``seconds``; of it, ``waited`` for
    the save before (at most one in flight) and ``staged`` in the save calls themselves (``built`` of it: the
    state dicts built, as ``state_of`` builds them), each summed over saves."""
    import torch
    import torch.distributed as dist

    from sprite.parity import recipe
    from sprite.runtime.ckpt import durable

    device = next(model.parameters()).device
    tokens = torch.randint(0, 100, (args.batch, args.seq), device=device)
    labels = torch.zeros(args.batch, dtype=torch.long, device=device)
    rank, world = dist.get_rank(), dist.get_world_size()
    sync = (lambda: torch.get_device_module(device).synchronize(device)) if device.type != "cpu" else (lambda: None)
    sync()
    dist.barrier()
    start = time.perf_counter()
    waited = staged = built = 0.0
    windows: list[tuple] = []  # each save's call and the moment it was sealed
    ticks: list[tuple] = []  # each step's start and end as the loop saw them (no device synchronisation)
    for step in range(1, args.steps + 1):
        began = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            loss = recipe.row_loss(model, tokens, labels)
        loss.backward()
        optimizer.step()
        ticks.append((began, time.perf_counter()))
        if every and step % every == 0:
            _FIT_SAVES[0] += 1  # the same count on every rank, so the same folder name
            called = time.perf_counter()
            durable.wait()  # what _background_save waits for first, timed apart
            waited += time.perf_counter() - called
            called = time.perf_counter()
            state = state_of()  # torch's get_model/optimizer_state_dict, which Lightning calls at every save too
            built += time.perf_counter() - called
            _background_save(state, root / f"fit-save{_FIT_SAVES[0]}", rank, world, True)
            staged += time.perf_counter() - called
            # queued after the save's seal job, on the same thread, so it runs once that save is sealed
            durable.later(lambda since=called: windows.append((since, time.perf_counter())))
            if rank == 0 and _FIT_SAVES[0] > 1:  # the save before, superseded once this one is sealed, as in a run
                # that keeps one: 35 saves of this state kept filled an H200 host's 64 GiB disk (2026-12-04)
                durable.later(lambda old=root / f"fit-save{_FIT_SAVES[0] - 1}": shutil.rmtree(old, ignore_errors=True))
            del state
    sync()
    # NCCL reduces device tensors only
    seconds = time.perf_counter() - start
    durable.wait()  # the last save's background work is not the fit's time; it is waited for outside it
    sealing = statistics.mean(end - since for since, end in windows) if windows else 0.0
    # A step the loop began while a save was in flight, against one it began with none: whether the slower steps
    # come from the background work or are a cost that stays once saving has started.
    beside, clear = [], []
    for began, end in ticks:
        (beside if any(since <= began < sealed for since, sealed in windows) else clear).append(end - began)
    figures = [seconds, waited, staged, built, sealing, statistics.median(beside) if beside else 0.0,
               statistics.median(clear) if clear else 0.0, len(beside)]
    elapsed = torch.tensor(figures, device=device, dtype=torch.float64)
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
    seconds, waited, staged, built, sealing, beside_step, clear_step, beside_count = elapsed.tolist()
    return {"seconds": seconds, "waited": waited, "staged": staged, "built": built, "sealing": sealing,
            "beside_step": beside_step, "clear_step": clear_step, "beside_count": int(beside_count)}


_FIT_SAVES = [0]


def _on_a_thread(fn):
    """``fn()`` as called on a thread other than the main one (as a background save's jobs are)."""
    import threading

    got = []
    thread = threading.Thread(target=lambda: got.append(fn()))
    thread.start()
    thread.join()
    return got[0]


def _writer(mode: str) -> None:
    """Background saves from here on are written in ``mode``, as ``sprite run --checkpoint-writer`` sets it."""
    from sprite import contract

    os.environ[contract.CHECKPOINT_WRITER] = mode


def worker(args) -> None:
    """Inside every rank (launched by ``main`` through sprite's plan)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    from sprite.runtime.ckpt import dcp_write

    if args.threads:
        dcp_write.MAX_THREADS = args.threads
    if args.hash_threads:
        from sprite.integrity import digest

        digest.workers = lambda: args.hash_threads
    if args.switch_interval:
        sys.setswitchinterval(args.switch_interval)
    if args.no_plan_cache:  # torch's default planner, which plans every save afresh (sprite before plan caching)
        dcp_write.planner = lambda state: None
    if args.wait_copies:  # each save waits for its device copies (sprite before queued copies)
        from sprite.runtime.ckpt import stage

        stage.QUEUED = False
    if args.buffer_per_tensor:  # a block of shared memory for each buffer (sprite before stage.ONE_BLOCK)
        from sprite.runtime.ckpt import stage

        stage.ONE_BLOCK = False
    if args.shared_buffers:  # thread mode stages as process mode does: shared memory, cudaHostRegister'ed
        from sprite.runtime.ckpt import save as hashed_save
        from sprite.runtime.ckpt.stage import stager

        hashed_save._stagers["thread"] = stager(shared=True)  # the stager the first save would otherwise make
    model, optimizer, get_model, get_optim = _state(args.model, args.accelerator)
    rank = dist.get_rank()
    sharded = {"model": get_model(model), "optim": get_optim(model, optimizer)}
    full = None
    if "full" in args.formats:
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        full = {"state_dict": get_model(model, options=options),
                "optimizer_states": [get_optim(model, optimizer, options=options)]}
    root = pathlib.Path(args.out)
    modes = [mode for mode in args.modes.split(",") if mode]
    runs = {**{f"sharded ({mode})": [] for mode in modes}, **({"full state": []} if full else {})}
    first = {} if args.steps_only else _first_saves(root, sharded, full, modes, rank)
    for repeat in range(0 if args.steps_only else args.repeats):
        for mode in modes:
            runs[f"sharded ({mode})"].append(_sharded(root, sharded, rank, repeat, mode))
        if full:  # a gather of the full state through gloo of CUDA tensors segfaults (torch 2.11, H200 shared)
            runs["full state"].append(_full(root, full, rank, repeat))
    loads_equal = args.steps_only or all([_check(root, sharded, args.repeats - 1, mode) for mode in modes])
    if rank == 0 and not args.steps_only:
        medians = {fmt: {key: statistics.median(run[key] for run in rows) for key in rows[0]}
                   for fmt, rows in runs.items()}
        print("PARTIAL " + json.dumps({"model": args.model, "world": dist.get_world_size(), "medians": medians,
                                       "first_stall": first,
                                       "torch_reads_sprites_folder": loads_equal, "device": _DEVICE[0],
                                       "torch": torch.__version__}), flush=True)
    fit = {}
    if args.steps:
        _writer(modes[0])
        from torch.distributed.checkpoint.state_dict import StateDictOptions

        from sprite import FSDP2Strategy
        from sprite.integrity import digest

        from sprite.runtime.ckpt import state_dicts

        # what a sharded save of a fit asks torch for: sprite's FSDP2Strategy's options, or with
        # --lightning-offload Lightning's ModelParallelStrategy's (every shard copied to the host in the call)
        options = StateDictOptions(cpu_offload=True) if args.lightning_offload else \
            FSDP2Strategy.sharded_state_dict_options()
        if args.torch_state_dicts:  # torch's functions at every save (sprite before ckpt.state_dicts)
            state_of = lambda: {"model": get_model(model, options=options),  # noqa: E731
                                "optim": get_optim(model, optimizer, options=options)}
        else:  # as FSDP2Strategy builds them (torch's functions where other options are asked for)
            state_of = lambda: {"model": state_dicts.model_state(model, options),  # noqa: E731
                                "optim": state_dicts.optimizer_state(model, optimizer, options)}
        # Warm-up with saves: the first save of a run makes its pinned host buffers and its gloo group once (1.9 s
        # on an H200, 2026-12-01); a long run pays that once, so it is measured apart, not in every comparison.
        first = _steps(model, optimizer, args, root, state_of, args.every)
        plain, saving = [], []
        for _ in range(args.repeats):  # interleaved, so drift in the machine touches both alike
            plain.append(_steps(model, optimizer, args, root, state_of, 0))
            saving.append(_steps(model, optimizer, args, root, state_of, args.every))
        middle = sorted(saving, key=lambda run: run["seconds"])[len(saving) // 2]
        fit = {"steps": args.steps, "every": args.every, "mode": modes[0], "threads": dcp_write.threads(),
               "switch_interval": sys.getswitchinterval(),
               "plan_cache": not args.no_plan_cache and modes[0] == "thread",
               "copies": "waited for" if args.wait_copies else "queued",
               "buffers": ("shared, " + ("a block each" if args.buffer_per_tensor else "views of one block")
                           if args.shared_buffers or modes[0] == "process" else "pinned"),
               "hash_threads": _on_a_thread(digest.workers),  # the count a background save hashes on
               "state_dict": ("Lightning's (cpu_offload=True)" if args.lightning_offload else "FSDP2Strategy's")
               + (", torch's functions at every save" if args.torch_state_dicts else ""),
               "no_ckpt": statistics.median(run["seconds"] for run in plain), "ckpt": middle["seconds"],
               "waited": middle["waited"], "staged": middle["staged"], "built": middle["built"],
               "sealing": middle["sealing"], "beside_step": middle["beside_step"], "clear_step": middle["clear_step"],
               "beside_count": middle["beside_count"],
               "plain_step": statistics.median(run["clear_step"] for run in plain),
               "first_run": first["seconds"],
               "first_staged": first["staged"]}
        if modes[0] == "process" or args.shared_buffers:  # how many of the stager's buffers are cudaHostRegister'ed
            from sprite.runtime.ckpt import save as hashed_save

            stager = hashed_save.stager_of(modes[0])
            host = stager.host if stager else None
            fit["pinned"] = f"{len(host.registered)} block(s) for {len(host.buffers)} buffers" if host else "no stager"
    if rank == 0:
        medians = {fmt: {key: statistics.median(run[key] for run in rows) for key in rows[0]}
                   for fmt, rows in runs.items() if rows}
        print("RESULT " + json.dumps({"model": args.model, "world": dist.get_world_size(), "medians": medians,
                                      "first_stall": first,
                                      "fit": fit, "torch_reads_sprites_folder": loads_equal,
                                      "device": _DEVICE[0], "torch": torch.__version__}))
    dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-0.5b-shape")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--accelerator", default="auto")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--modes", default="thread,process", help="torch's async checkpointer types to measure")
    parser.add_argument("--formats", default="sharded,full", help="sharded, full (the gathered full state)")
    parser.add_argument("--steps", type=int, default=40, help="steps of the step-time comparison (0: skip it)")
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=8)
    parser.add_argument("--steps-only", action="store_true", help="measure the step-time comparison alone")
    parser.add_argument("--threads", type=int, default=0, help="files each rank writes in parallel (0: sprite's)")
    parser.add_argument("--hash-threads", type=int, default=0,
                        help="threads each rank hashes its files on (0: sprite's digest.workers())")
    parser.add_argument("--switch-interval", type=float, default=0.0,
                        help="Python's thread switch interval in the ranks, seconds (0: Python's default)")
    parser.add_argument("--wait-copies", action="store_true",
                        help="each save waits for its copies off the device instead of queueing them on a stream of"
                             " their own, for a before/after figure")
    parser.add_argument("--no-plan-cache", action="store_true",
                        help="plan every sharded save afresh (torch's default planner), for a before/after figure")
    parser.add_argument("--lightning-offload", action="store_true",
                        help="build each save's state dict with Lightning's ModelParallelStrategy options"
                             " (cpu_offload=True: every shard copied to the host in the save call) instead of"
                             " sprite's FSDP2Strategy's (left on the device), for a before/after figure")
    parser.add_argument("--torch-state-dicts", action="store_true",
                        help="build each save's state dicts with torch's get_model/optimizer_state_dict every time"
                             " instead of from the model's and optimizer's state_dict() once torch's agreed"
                             " (sprite.runtime.ckpt.state_dicts), for a before/after figure")
    parser.add_argument("--shared-buffers", action="store_true",
                        help="in thread mode, stage into shared memory registered with CUDA (as process mode does)"
                             " instead of pinned host buffers, for a before/after figure")
    parser.add_argument("--buffer-per-tensor", action="store_true",
                        help="stage shared buffers in a block of shared memory each instead of views of one block"
                             " (sent to torch's checkpoint process as one descriptor each), for a before/after figure")
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    if args.repeats < 1 or args.devices < 1 or args.every < 1 or args.steps < 0:
        parser.error("--repeats, --devices and --every must be 1 or more, --steps 0 or more")
    # Python refuses a switch interval of 0 or less
    if min(args.threads, args.hash_threads) < 0 or not 0 <= args.switch_interval <= 1:
        parser.error("--threads and --hash-threads must be 0 or more and --switch-interval between 0 and 1 second"
                     " (0: the default)")
    if args.shared_buffers and args.modes.split(",")[0] != "thread":
        parser.error("--shared-buffers changes thread mode's buffers: give --modes thread")
    if args.buffer_per_tensor and not (args.shared_buffers or args.modes.split(",")[0] == "process"):
        parser.error("--buffer-per-tensor changes shared buffers: give --modes process (or thread with"
                     " --shared-buffers)")
    if args.worker:
        worker(args)
        return 0
    import subprocess

    from sprite.launch.execute import environment, resolve_program
    from sprite.launch.plan import plan_run

    with tempfile.TemporaryDirectory(dir=os.environ.get("SPRITE_BENCH_TMP")) as tmp:
        flags = {"script": os.path.abspath(__file__), "devices": args.devices, "strategy": "fsdp",
                 "accelerator": args.accelerator, "env": {"HF_HUB_OFFLINE": "1"},
                 # every rank gets this command's own options (argparse takes the last of a repeated one)
                 "args": [*sys.argv[1:], "--worker", "--out", tmp]}
        plan = plan_run(flags)
        with tempfile.TemporaryFile("w+") as err:
            run = subprocess.Popen([resolve_program(plan), *plan.argv[1:]], env=environment(plan),
                                   stdout=subprocess.PIPE, stderr=err, text=True)
            out = []
            for text in run.stdout:  # the formats' figures as soon as they are measured (a run cut short keeps them)
                out.append(text)
                if "PARTIAL " in text:
                    partial = json.loads(text.split("PARTIAL ", 1)[1])
                    print(report({**partial, "fit": {}}, args), flush=True)
            run.wait()
            err.seek(0)
            stderr = err.read()
    line = next((l for l in out if "RESULT " in l), None)
    if run.returncode != 0 or line is None:
        print("".join(out)[-3000:], stderr[-200000:], file=sys.stderr)
        return 1
    result = json.loads(line.split("RESULT ", 1)[1])
    if result["fit"]:
        print(report(result, args).splitlines()[-1])
    return 0


def report(result: dict, args) -> str:
    """The figures as text: each ratio against the baseline measured in the same run."""
    import platform

    lines = [f"model {result['model']}, {result['world']} ranks on {result['device']} ({platform.node()}, torch"
             f" {result['torch']}), medians of {args.repeats};"
             f" torch's reader loads sprite's sharded folder equal: {result['torch_reads_sprites_folder']}"]
    for fmt, m in result["medians"].items():
        plain_durable = m["plain_save"] + m["plain_fsync"]
        lines.append(
            f"{fmt:>18}: stall {m['sprite_stall']:.3f} s vs sync plain torch.save {m['plain_save']:.3f} s (ratio"
            f" {m['sprite_stall'] / m['plain_save']:.2f}, target <= 0.25); sealed on disk {m['sprite_sealed']:.3f} s"
            f" vs plain save + fsync {plain_durable:.3f} s (ratio {m['sprite_sealed'] / plain_durable:.2f}, target"
            f" <= 1.3); Lightning's own save {m['format_save']:.3f} s (stall ratio"
            f" {m['sprite_stall'] / m['format_save']:.2f}); load warm {m['sprite_load']:.3f} s vs plain"
            f" {m['plain_load']:.3f} s (ratio {m['sprite_load'] / m['plain_load']:.2f}), Lightning's"
            f" {m['format_load']:.3f} s; load cold {m['sprite_cold']:.3f} s vs plain {m['plain_cold']:.3f} s (ratio"
            f" {m['sprite_cold'] / m['plain_cold']:.2f}), Lightning's {m['format_cold']:.3f} s; bytes"
            f" {m['sprite_bytes'] / 1e6:.1f} MB vs {m['plain_bytes'] / 1e6:.1f} MB; the run's first save (pinned"
            f" buffers made) stalled {result.get('first_stall', {}).get(fmt, float('nan')):.3f} s, measured apart")
    fit = result.get("fit")
    if fit:
        saves = fit["steps"] // fit["every"]
        rest = fit["ckpt"] - fit["no_ckpt"] - fit["waited"] - fit["staged"]
        lines.append(f"step time: {fit['steps']} steps with a sharded save ({fit['mode']}, {fit.get('threads')} files"
                     f" a rank, hashed on {fit.get('hash_threads')} threads,"
                     f" switch interval {fit.get('switch_interval')} s, plans cached:"
                     f" {fit.get('plan_cache')}, device copies {fit.get('copies', 'waited for')}) every"
                     f" {fit['every']}:"
                     f" {fit['ckpt']:.3f} s vs {fit['no_ckpt']:.3f} s without checkpoints (ratio"
                     f" {fit['ckpt'] / fit['no_ckpt']:.3f}, target <= 1.05); of the {saves} saves' extra"
                     f" {fit['ckpt'] - fit['no_ckpt']:.3f} s: {fit['waited']:.3f} s waiting for the save before,"
                     f" {fit['staged']:.3f} s in the save calls (of it {fit.get('built', float('nan')):.3f} s"
                     f" building the state dicts, {fit.get('state_dict', 'default')}), {rest:.3f} s slower steps"
                     f" beside the background writes (and, with queued copies, the copies themselves);"
                     f" the warm-up run's first save (pinned buffers, gloo group) staged in"
                     f" {fit['first_staged']:.3f} s, measured apart; each save sealed {fit['sealing']:.3f} s after"
                     f" its call (mean), one save every {fit['ckpt'] / saves:.3f} s of the fit: the background"
                     f" work busy {fit['sealing'] * saves / fit['ckpt']:.0%} of it; median step as the loop saw it"
                     f" (no synchronisation): {fit['beside_step'] * 1000:.1f} ms begun with a save in flight"
                     f" ({fit['beside_count']} of {fit['steps']}), {fit['clear_step'] * 1000:.1f} ms with none,"
                     f" {fit['plain_step'] * 1000:.1f} ms in the fits without saves"
                     + f"; stager buffers {fit.get('buffers', 'pinned')}"
                     + (f", registered with CUDA: {fit['pinned']}" if "pinned" in fit else ""))
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
