"""Seal every checkpoint a script saves under ``python -m sprite.runtime`` with a manifest, and drop it on removal.

``Trainer.save_checkpoint`` is where every save goes (ModelCheckpoint calls it, Lightning 2.6.6
callbacks/model_checkpoint.py:600, and it runs on every rank, trainer/trainer.py:1463-1465), so sprite wraps it:
rank 0 first picks a name that does not exist (a save never writes into an existing checkpoint folder), every
rank then saves as Lightning does and hashes the files it wrote, and rank 0 seals once every rank has confirmed.
A new name's files, manifest and folders are fsynced in the background (``durable``); a save that replaces a
checkpoint is fsynced during the save, and a folder save to a name in use goes to a fresh hidden folder that
replaces the old one only when complete.
``ModelCheckpoint._remove_checkpoint`` (save_top_k) runs once the newer checkpoint is durable on every rank, and
also removes the manifest sprite wrote beside a file.
"""

from __future__ import annotations

import datetime
import os
import re
import secrets
from pathlib import Path

from sprite import integrity
from sprite.runtime import dist
from sprite.runtime import hooks
from sprite.runtime import trail
from sprite.runtime.ckpt import durable
from sprite.runtime.ckpt import save as hashed_save


def _plan(target: Path, folder: bool) -> dict:
    """Rank 0: where this save writes, and whether it replaces a checkpoint of the same name (then it is made
    durable during the save). A folder save gets a folder made just now (never one that existed)."""
    if not folder:
        return {"write": str(target), "swap": False, "replaces": os.path.lexists(target)}
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(target)
        return {"write": str(target), "swap": False, "replaces": False}
    except FileExistsError:
        fresh = target.with_name(f".{target.name}.sprite-new-{secrets.token_hex(4)}")
        os.mkdir(fresh)
        return {"write": str(fresh), "swap": True, "replaces": True}


def _mine(written: Path, rank: int, world: int) -> list[str]:
    """The files of ``written`` that this rank wrote and hashes: ``__<rank>_*`` shards of a
    torch.distributed.checkpoint folder (torch/distributed/checkpoint/filesystem.py:690, prefix ``__{i}_``);
    rank 0 takes every other file (``.metadata``, Lightning's ``meta.pt``) and a single-file save."""
    if written.is_file():
        return [written.name] if rank == 0 else []
    names = [Path(os.path.relpath(os.path.join(d, f), written)).as_posix() for d, _, fs in os.walk(written) for f in fs]
    return sorted(name for name in names if (owner(name, world) or 0) == rank)


def owner(name: str, world: int) -> int | None:
    """The rank that wrote ``name`` of a torch.distributed.checkpoint folder when it is a shard file (``__<rank>_``
    prefix, a rank of ``world``), else None."""
    match = _SHARD.match(Path(name).name)
    return int(match.group(1)) if match and int(match.group(1)) < world else None


_SHARD = re.compile(r"__(\d+)_")


def describe_mine(written: Path, rank: int, world: int, sync: bool = True) -> tuple[bool, object, list]:
    """(True, {relpath: {size, sha256}}, paths) or (False, the reason, []) for this rank's files, fsynced now when
    ``sync``, else named in ``paths`` for a background fsync. A file this process wrote and hashed itself
    (hashed_save) is not read again, nor fsynced again when its write saw to that."""
    try:
        root = written if written.is_dir() else written.parent
        names = _mine(written, rank, world)
        known = {name: hashed_save.known_entry(root / name) for name in names}
        unknown = [name for name in names if not known[name]]
        files = integrity.describe(root, unknown)
        files.update({name: entry for name, entry in known.items() if entry})
        paths = [str(root / name) for name in names
                 if not known[name] or not hashed_save.fsync_seen_to(root / name)]
        if sync:
            for path in paths:
                integrity.fsync_file(path)
        return True, files, [] if sync else paths
    except (OSError, integrity.IntegrityError) as err:
        return False, f"rank {rank}: {err}", []


def _meta(trainer, fmt: str, weights_only) -> dict:
    strategy = trainer.strategy
    return {"step": trainer.global_step, "epoch": trainer.current_epoch, "world_size": trainer.world_size,
            "strategy": dist.family(strategy), "strategy_class": type(strategy).__name__, "format": fmt,
            "weights_only": bool(weights_only),
            "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="microseconds")}


def _finish(plan: dict, target: Path, trainer, weights_only, reports: list) -> tuple[list, list, bool]:
    """Rank 0: swap a fresh folder into place, replace a stale manifest, seal, record. A save that replaces a
    checkpoint is fsynced now; for a new name, returns the files (manifest, audit trail) and folders to fsync in
    the background. The last item says whether the checkpoint came out sealed."""
    written, sync = Path(plan["write"]), plan["replaces"]
    failed = [info for ok, info, _ in reports if not ok]
    if failed:
        trail.say(f"checkpoint {target} is not sealed (a rank could not confirm its files): {'; '.join(failed)}")
        trail.audit("checkpoint_written", path=str(target), step=trainer.global_step, verified=False)
        return [], [], False
    files = {rel: entry for ok, info, _ in reports for rel, entry in info.items()}
    folders = [folder for folder, _, _ in os.walk(written)] if written.is_dir() else []
    if sync:
        for folder in folders:
            integrity.fsync_dir(folder)
    with durable.LOCK:
        if plan["swap"]:
            _swap(written, target)
        stale = integrity.manifest_path(target)
        if not target.is_dir() and os.path.lexists(stale):
            os.unlink(stale)  # sprite's manifest of the file Lightning has just replaced (cloud_io._atomic_save)
        fmt = "dcp" if target.is_dir() else "file"
        manifest = integrity.seal(target, _meta(trainer, fmt, weights_only), files, sync=sync)
    record = {"path": str(target), "step": trainer.global_step, "verified": True}
    if sync:
        trail.audit("checkpoint_written", **record)
        return [], [], True
    trail = trail.audit_unsynced("checkpoint_written", **record)  # fsynced with the checkpoint
    dirs = list(dict.fromkeys([*folders, str(manifest.parent), str(target.parent)]))  # a new folder's entry too
    return [str(manifest), *([trail] if trail else [])], dirs, True


def _swap(fresh: Path, target: Path) -> None:
    """Put the complete ``fresh`` folder at ``target``; the old one goes (kept aside if sprite did not seal it)."""
    aside = target.with_name(f".{target.name}.sprite-old-{secrets.token_hex(4)}")
    os.rename(target, aside)
    os.rename(fresh, target)
    integrity.fsync_dir(target.parent)
    if os.path.lexists(integrity.manifest_path(aside)):
        import shutil

        shutil.rmtree(aside)
    else:
        trail.say(f"the folder that was at {target} had no sprite manifest; it is kept as {aside}")


def _is_folder_save(strategy) -> bool:
    """Whether Lightning writes this strategy's checkpoint as a folder (torch.distributed.checkpoint)."""
    return bool(getattr(strategy, "_save_distributed_checkpoint", False)) or \
        getattr(strategy, "_state_dict_type", None) == "sharded"


def save_checkpoint(original, trainer, filepath, weights_only=None, storage_options=None) -> None:
    """Lightning's save, then the seal. Every rank calls it, as Lightning requires.

    Raises:
        OSError: rank 0 could not create the checkpoint's folder (raised on every rank), or an earlier
            checkpoint's background fsync failed (raised on that rank).
    """
    durable.check()
    strategy = trainer.strategy
    target = Path(os.path.abspath(filepath))
    plan = None
    if strategy.is_global_zero:
        try:
            plan = _plan(target, _is_folder_save(strategy))
        except OSError as err:
            plan = {"error": f"cannot create the checkpoint folder for {target}: {err}"}
    plan = strategy.broadcast(plan)
    if "error" in plan:
        raise OSError(plan["error"])
    original(trainer, plan["write"], weights_only, storage_options)
    mine = describe_mine(Path(plan["write"]), trainer.global_rank, trainer.world_size, sync=plan["replaces"])
    reports = dist.gather(mine)
    files, folders, sealed = [], [], True
    if strategy.is_global_zero:
        files, folders, sealed = _finish(plan, target, trainer, weights_only, reports)
    durable.saved([*mine[2], *files], folders, sealed=sealed)
    strategy.barrier("sprite.seal_checkpoint")


def remove_checkpoint(original, callback, trainer, filepath) -> None:
    """Lightning's removal, then rank 0 removes the manifest sprite wrote beside the removed file; both in the
    background once the newest checkpoint is durable on every rank (``durable.remove_later``)."""
    def remove():
        original(callback, trainer, filepath)
        manifest = integrity.manifest_path(Path(filepath))
        if trainer.is_global_zero and not os.path.lexists(filepath) and os.path.lexists(manifest):
            os.unlink(manifest)

    durable.remove_later(filepath, remove)


def install() -> None:
    """Wrap ``Trainer.save_checkpoint`` and ``ModelCheckpoint._remove_checkpoint``, hash single-file saves
    while they are written, and read sharded checkpoints with sprite's reader (idempotent)."""
    from lightning.pytorch import Trainer
    from lightning.pytorch.callbacks import ModelCheckpoint

    hooks.wrap(Trainer, "save_checkpoint", save_checkpoint)
    hooks.wrap(ModelCheckpoint, "_remove_checkpoint", remove_checkpoint)
    from sprite.runtime.ckpt import dcp_read

    hashed_save.install()
    dcp_read.install()
