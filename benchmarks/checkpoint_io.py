"""Checkpoint save and load with sprite's integrity (write once, SHA-256 manifest, fsync, verified load)
against a plain torch.save / torch.load of the same state, measured in the same run.

The parity recipe's model (LoRA on a Qwen2 decoder; default qwen2.5-0.5b-shape) is sharded with FSDP2 over the
launched ranks and takes one AdamW step, so the state is what a LoRA checkpoint holds: every weight, frozen ones
included, and the adapter's optimizer state. The sprite side is what sprite's runtime does with every checkpoint
(sprite.runtime.ckpt.save, ckpt_seal, durable): write, hash from the page cache on a pool of threads, seal, and
fsync the new files on a background thread, so a save is timed twice: until it returns to the training loop
("save") and until its files are on disk on every rank ("durable"). Loads verify as `sprite run --resume` does
(sprite.runtime.ckpt.shared_verify: every rank hashes its share of the files; a sharded folder's shard files while it
loads, the rest first). Every load also copies what it read into the state's own tensors (a resume is not done
before the model holds it), for all sides alike.
Two formats:
- sharded: a torch.distributed.checkpoint folder written by sprite's writer (hashed_save.dcp_save with
  sprite.runtime.ckpt.dcp_write: no torch.save per tensor, fsync left to the seal); load = every rank loads it with
  sprite's reader (sprite.runtime.ckpt.dcp_read.load, which sprite's runtime gives Lightning in place of dcp.load). Both hold off Python's cycle collector (gcpause.paused_gc). Baseline:
  each rank torch.save / torch.load of its own local shards, one file per rank.
- full state: the gathered state on rank 0 written by the runtime's hashed save (torch.save into a temporary
  name, a pool of threads hashes each 64 MiB piece, rename), then sealed; load = verify, then torch.load with
  mmap=True, as Lightning's FSDP strategies load a full-state file (lightning/fabric/strategies/model_parallel.py).
  Baseline: rank 0 torch.save / torch.load of the same gathered dict. Gathering is done once, outside all timings.
Times are medians over --repeats, baseline and sprite interleaved; each save goes to a new name. The plain save
does not fsync; the time an fsync of its files takes afterwards is timed too, and sprite's durable time is given
as a ratio to that durable plain save (plain save + fsync). Also printed, to tell the format's cost from
sprite's: the same save and load without sprite (Lightning's own dcp.save / dcp.load, whose FileSystemWriter
fsyncs every file by default, or its single-file write, which does not, then its mmap load), no manifest. Loads
are timed twice: from the page cache the save just filled, and cold (each load's files dropped from the page
cache first), as a resume on a fresh node reads them.

After the timings, torch's own reader loads sprite's last sharded folder into a blank copy of the state, which
must equal the state saved (the run fails otherwise).

    python benchmarks/checkpoint_io.py [--model qwen2.5-0.5b-shape] [--devices 2] [--accelerator auto] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
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
    device = torch.device(kind.name, local) if kind.name != "cpu" else torch.device("cpu")
    if kind.name != "cpu":
        kind.module().set_device(device)  # NCCL's communicator takes the current device, not the model's
    dist.init_process_group(backend_for(device))
    model = recipe.build_model(Settings(model=model_name, global_batch=2)).to(device)
    shard_model(model, init_device_mesh(device.type, (dist.get_world_size(),)))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
    recipe.row_loss(model, torch.zeros(2, 8, dtype=torch.long, device=device), torch.zeros(2, dtype=torch.long,
                                                                                           device=device)).backward()
    optimizer.step()
    return model, optimizer, get_model_state_dict, get_optimizer_state_dict


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


def _seal(path: pathlib.Path, rank: int, world: int) -> None:
    """What sprite's runtime does after every save to a new name (sprite.runtime.ckpt.seal): each of ``world``
    ranks hashes the files it wrote (a single file hashed as it was written is not read again), rank 0 seals them
    all, and every rank queues the fsync of its files (rank 0: also the manifest and folders) on its background
    thread."""
    import torch.distributed as dist

    from sprite import integrity
    from sprite.runtime.ckpt import durable
    from sprite.runtime.ckpt.seal import describe_mine

    mine = describe_mine(path, rank, world, sync=False)
    reports, files, folders = [mine], [], []
    if world > 1:  # a full-state file is rank 0's alone: no gather
        reports = [None] * world
        dist.all_gather_object(reports, mine)
    if rank == 0:
        assert all(ok for ok, _, _ in reports), reports
        manifest = integrity.seal(path, {"bench": True}, {rel: entry for _, described, _ in reports
                                                          for rel, entry in described.items()}, sync=False)
        files, folders = [str(manifest)], [*([str(path)] if path.is_dir() else []), str(manifest.parent)]
    durable.saved([*mine[2], *files], folders)


def _durable() -> None:
    """Wait until this rank's background fsyncs are done (every rank calls it; _timed's barrier then waits for all)."""
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


def _sharded(root: pathlib.Path, state: dict, rank: int, repeat: int) -> dict:
    """One repeat of the sharded format: sprite's sealed DCP save and verified load, and the per-rank baseline."""
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    from sprite.runtime.ckpt import dcp_read
    from sprite.runtime.ckpt import shared_verify
    from sprite.runtime.ckpt.save import dcp_save

    folder, plain, bare = root / f"dcp{repeat}", root / f"plain{repeat}", root / f"bare{repeat}"
    local = {key: {k: (v.to_local() if hasattr(v, "to_local") else v) for k, v in part.items()}
             for key, part in (("model", state["model"]), ("optim", _flat(state["optim"])))}
    world = dist.get_world_size()

    def sprite_save():
        if rank == 0:
            folder.mkdir()
        dist.barrier()
        dcp_save(state, folder)
        _seal(folder, rank, world)

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

    def format_save():  # the format without sprite: Lightning's own dcp.save (fsyncs, sync_files=True), no manifest
        dcp.save(state, checkpoint_id=bare)

    times = {"plain_save": _timed(plain_save, clean=True),
             "plain_fsync": _timed(lambda: _fsync(plain / f"rank{rank}.pt")),
             "format_save": _timed(format_save, clean=True), "sprite_save": _timed(sprite_save, clean=True),
             "sprite_durable": _timed(_durable),
             "plain_load": _timed(plain_load), "format_load": _timed(lambda: dcp.load(state, checkpoint_id=bare)),
             "sprite_load": _timed(sprite_load)}
    times.update(plain_cold=_cold(plain_load, plain), format_cold=_cold(lambda: dcp.load(state, checkpoint_id=bare),
                                                                        bare), sprite_cold=_cold(sprite_load, folder))
    return {**times, "plain_bytes": _folder_bytes(plain) if rank == 0 else 0,
            "sprite_bytes": _folder_bytes(folder) if rank == 0 else 0}


def _check(root: pathlib.Path, state: dict, repeat: int) -> bool:
    """Whether torch's own reader (dcp.load, FileSystemReader) loads sprite's sharded folder of ``repeat`` into a
    blank copy of ``state`` equal to ``state``, on every rank."""
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    blank = _like(state, torch.zeros_like)  # new containers, so that nothing of ``state`` is loaded into
    dcp.load(blank, checkpoint_id=root / f"dcp{repeat}")
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
    """One repeat of the full-state format on rank 0: sprite's hashed write and seal, verified load; the baseline."""
    import torch

    from sprite import integrity
    from sprite.runtime.ckpt.save import atomic_save

    from lightning.fabric.utilities.cloud_io import _atomic_save

    path, plain, bare = root / f"full{repeat}.ckpt", root / f"full{repeat}.plain.ckpt", root / f"full{repeat}.bare"
    dest = _like(state, torch.empty_like) if rank == 0 else None  # where a load puts the state: the model's tensors

    def sprite_save():  # Lightning's TorchCheckpointIO write under sprite's runtime, then the seal
        if rank == 0:
            atomic_save(state, path)
            _seal(path, rank, 1)

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
             "format_save": _timed(format_save, clean=True), "sprite_save": _timed(sprite_save, clean=True),
             "sprite_durable": _timed(_durable),
             "plain_load": _timed(plain_load), "format_load": _timed(format_load), "sprite_load": _timed(sprite_load)}
    times.update(plain_cold=_cold(plain_load, plain), format_cold=_cold(format_load, bare),
                 sprite_cold=_cold(sprite_load, path))
    return {**times, "plain_bytes": plain.stat().st_size if rank == 0 else 0,
            "sprite_bytes": path.stat().st_size if rank == 0 else 0}


def worker(args) -> None:
    """Inside every rank (launched by ``main`` through sprite's plan)."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    model, optimizer, get_model, get_optim = _state(args.model, args.accelerator)
    rank = dist.get_rank()
    sharded = {"model": get_model(model), "optim": get_optim(model, optimizer)}
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    full = {"state_dict": get_model(model, options=options), "optimizer_states": [get_optim(model, optimizer,
                                                                                            options=options)]}
    root = pathlib.Path(args.out)
    runs = {"sharded": [], "full state": []}
    for repeat in range(args.repeats):
        runs["sharded"].append(_sharded(root, sharded, rank, repeat))
        runs["full state"].append(_full(root, full, rank, repeat))
    loads_equal = _check(root, sharded, args.repeats - 1)  # every rank
    if rank == 0:
        medians = {fmt: {key: statistics.median(run[key] for run in rows) for key in rows[0]}
                   for fmt, rows in runs.items()}
        print("RESULT " + json.dumps({"model": args.model, "world": dist.get_world_size(), "medians": medians,
                                      "torch_reads_sprites_folder": loads_equal}))
    dist.destroy_process_group()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="qwen2.5-0.5b-shape")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--accelerator", default="auto")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    if args.repeats < 1 or args.devices < 1:
        parser.error("--repeats and --devices must be 1 or more")
    if args.worker:
        worker(args)
        return 0
    import subprocess

    from sprite.launch.execute import resolve_program
    from sprite.launch.plan import plan_run

    with tempfile.TemporaryDirectory(dir=os.environ.get("SPRITE_BENCH_TMP")) as tmp:
        flags = {"script": os.path.abspath(__file__), "devices": args.devices, "strategy": "fsdp",
                 "accelerator": args.accelerator, "env": {"HF_HUB_OFFLINE": "1"},
                 "args": ["--worker", "--out", tmp, "--model", args.model, "--accelerator", args.accelerator,
                          "--repeats", str(args.repeats)]}
        plan = plan_run(flags)
        run = subprocess.run([resolve_program(plan), *plan.argv[1:]], env={**os.environ, **plan.env},
                             capture_output=True, text=True)
    line = next((l for l in run.stdout.splitlines() if "RESULT " in l), None)
    if run.returncode != 0 or line is None:
        print(run.stdout[-3000:], run.stderr[-3000:], file=sys.stderr)
        return 1
    result = json.loads(line.split("RESULT ", 1)[1])
    print(f"model {result['model']}, {result['world']} ranks, medians of {args.repeats}; torch's reader loads"
          f" sprite's sharded folder equal: {result['torch_reads_sprites_folder']}; sprite = write once,"
          " SHA-256 manifest, fsync in the background / verified load (shard files while they load); loads include"
          " the copy into the state")
    for fmt, m in result["medians"].items():
        durable = m["sprite_save"] + m["sprite_durable"]
        print(f"{fmt:>10}: save {m['sprite_save']:.2f} s vs plain {m['plain_save']:.2f} s (ratio"
              f" {m['sprite_save'] / m['plain_save']:.2f}); on disk after {durable:.2f} s vs plain save + fsync"
              f" {m['plain_save'] + m['plain_fsync']:.2f} s (ratio"
              f" {durable / (m['plain_save'] + m['plain_fsync']):.2f}); load {m['sprite_load']:.2f} s"
              f" vs plain {m['plain_load']:.2f} s (ratio {m['sprite_load'] / m['plain_load']:.2f});"
              f" without sprite: save {m['format_save']:.2f} s, load {m['format_load']:.2f} s; from a cold page"
              f" cache: load {m['sprite_cold']:.2f} s vs plain {m['plain_cold']:.2f} s (ratio"
              f" {m['sprite_cold'] / m['plain_cold']:.2f}), without sprite {m['format_cold']:.2f} s; bytes"
              f" {m['sprite_bytes'] / 1e6:.1f} MB vs {m['plain_bytes'] / 1e6:.1f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
