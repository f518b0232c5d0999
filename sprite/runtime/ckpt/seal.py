"""Seal every checkpoint a script saves under ``python -m sprite.runtime`` with a manifest, in the background.

``Trainer.save_checkpoint`` is where every save goes (ModelCheckpoint calls it, Lightning 2.6.6
callbacks/model_checkpoint.py:600, the preemption save too, and it runs on every rank, trainer/trainer.py:1463-1465),
so sprite wraps it. The training loop's part (the stall): wait for the save in flight (at most one a rank,
``durable.wait``), rank 0 picks a name that does not exist (a save never writes into an existing checkpoint
folder), and every rank runs Lightning's save, whose writes sprite stages in host memory
(``sprite.runtime.ckpt.save``). The rest is one job on this rank's background thread (``durable``): the writes,
the hashes, the fsync of this rank's files and folders, then a gather on a gloo process group of its own; rank 0
seals the checkpoint under its temporary name (the manifest last, fsynced), then puts it in place, and tells every
rank the outcome. A save that
fails on any rank is not sealed, removes nothing, and fails the run at the next save or the end of the fit.
``ModelCheckpoint._remove_checkpoint`` (save_top_k) runs after that job, and also removes the manifest sprite
wrote beside a file.
"""

from __future__ import annotations

import datetime
import os
import re
import secrets
import time
from pathlib import Path

from sprite import contract
from sprite import integrity
from sprite.runtime import allranks
from sprite.runtime import hooks
from sprite.runtime import trail
from sprite.runtime.ckpt import background
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


def free_name(trainer, base: str, ours=lambda: ()) -> str:
    """``BASE.ckpt``, or ``BASE-vK.ckpt`` with the least K free, where that name holds a checkpoint not in
    ``ours()`` (the paths this run saved): rank 0's pick, taken by every rank. sprite's own saves (the clock's,
    the preemption's) replace only checkpoints of their own run."""
    path = None
    if trainer.is_global_zero:
        path, version, known = f"{base}.ckpt", 0, None
        while os.path.lexists(path):
            try:
                known = known if known is not None else set(ours())
            except Exception:  # noqa: BLE001 - a damaged audit trail: none taken for ours (then a new name);
                known = set()  # raising here would leave the other ranks waiting in the broadcast below
            if path in known:
                break
            version += 1
            path = f"{base}-v{version}.ckpt"
    return trainer.strategy.broadcast(path) if trainer.world_size > 1 else path


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
            "strategy": allranks.family(strategy), "strategy_class": type(strategy).__name__, "format": fmt,
            "weights_only": bool(weights_only),
            "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="microseconds")}


def _timing(started: float) -> dict:
    """The goodput fields of a save's record: the stall it cost the training loop (from the call to the return,
    waiting for the save before it included), the wall time training went on, and the attempt."""
    now = time.time()
    attempt = os.environ.get(contract.ATTEMPT, "")
    return {"stall_seconds": round(now - started, 4), "resumed_at": round(now, 4),
            "attempt": int(attempt) if attempt.isascii() and attempt.isdigit() else 0}


def _finish(plan: dict, target: Path, meta: dict, pending: list, reports: list) -> bool:
    """Rank 0, once every rank reported: seal the checkpoint (fsynced) while it is still under its temporary name,
    then put it in place (a fresh folder swapped in, its manifest inside; a file and the manifest beside it renamed
    over the ones they replace, back to back), and record. Until those renames a checkpoint of the same name stays
    whole and sealed: a save that fails or is killed before them leaves it valid. Returns whether it is sealed."""
    written = Path(plan["write"])
    failed = [info for ok, info in reports if not ok]
    if failed:
        trail.say(f"checkpoint {target} is not sealed (a rank could not write or confirm its files): "
                  f"{'; '.join(failed)}")
        trail.audit("checkpoint_written", path=str(target), step=meta["step"], verified=False,
                    **plan.get("timing", {}))
        return False
    files = {rel: entry for ok, info in reports for rel, entry in info.items()}
    aside = [write for write in pending if write.temp is not None]
    with durable.LOCK:
        if plan["folder"]:
            integrity.seal(written, meta, files, sync=True, name=target.name)
            if plan["swap"]:
                _swap(written, target)
        elif len(aside) == 1 and len(pending) == 1:  # a file written under a temporary name (save.py)
            sealed = integrity.seal(aside[0].temp, meta, files, sync=True, name=target.name)
            aside[0].publish()
            os.replace(sealed, integrity.manifest_path(target))  # over sprite's manifest of the file replaced
        else:  # written in place by another CheckpointIO: its old manifest no longer describes it
            stale = integrity.manifest_path(target)
            if os.path.lexists(stale):
                os.unlink(stale)
            for write in pending:
                write.publish()
            integrity.seal(target, meta, files, sync=True)
        integrity.fsync_dir(target.parent)
    trail.audit("checkpoint_written", path=str(target), step=meta["step"], verified=True, **plan.get("timing", {}))
    return True


def _complete(plan: dict, target: Path, meta: dict, pending: list, rank: int, world: int, group) -> None:
    """The background job of one save on every rank (module docstring). Raises SaveFailed when the save came out
    without a manifest (kept by durable, so the run stops)."""
    written = Path(plan["write"])
    try:
        files = {}
        for write in pending:
            files.update(write.run())
        if plan["folder"] or not pending:  # a folder; or a file another CheckpointIO wrote at once
            ok, mine, _ = describe_mine(written, rank, world, sync=True)
            if not ok:
                raise OSError(mine)
            files.update(mine)
            for folder in [folder for folder, _, _ in os.walk(written)] if plan["folder"] else []:
                integrity.fsync_dir(folder)
        report = (True, files)
    except BaseException as err:  # noqa: BLE001 - told to rank 0, which then seals nothing; every rank must
        # reach the gather below, whatever this rank's write raised, or the others wait in it
        report = (False, f"rank {rank}: {type(err).__name__}: {err}")
    reports = background.gather(report, group, rank, world)
    sealed, why = False, ""
    if rank == 0:
        try:
            sealed = _finish(plan, target, meta, pending, reports)
        except Exception as err:
            why = f"rank 0 could not seal it: {type(err).__name__}: {err}"
            trail.say(f"checkpoint {target} is not sealed: {type(err).__name__}: {err}")
    sealed, why = background.broadcast((sealed, why), group, rank, world)
    durable.outcome(sealed)
    if not sealed:
        for write in pending:
            write.discard()
        reason = report[1] if not report[0] else why or "another rank could not write its files (its log says why)"
        raise durable.SaveFailed(f"Checkpoint {target} was not saved: {reason.rstrip('.')}.", *durable.advice(reason))


def _swap(fresh: Path, target: Path) -> None:
    """Put the complete, sealed ``fresh`` folder at ``target`` (two renames back to back); the old one goes, once
    the new one is durable in its place (kept aside if sprite did not seal it)."""
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
    """Lightning's save, staged in host memory; written and sealed in the background. Every rank calls it, as
    Lightning requires.

    Raises:
        SaveFailed: an earlier checkpoint could not be saved in the background (raised on every rank).
        OSError: rank 0 could not create the checkpoint's folder (raised on every rank).
    """
    started = time.time()
    durable.wait()
    strategy = trainer.strategy
    target = Path(os.path.abspath(filepath))
    folder = _is_folder_save(strategy)
    plan = None
    if strategy.is_global_zero:
        try:
            plan = _plan(target, folder)
        except OSError as err:
            plan = {"error": f"cannot create the checkpoint folder for {target}: {err}"}
    plan = strategy.broadcast(plan)
    if "error" in plan:
        raise OSError(plan["error"])
    plan["folder"] = folder
    group = background.group()
    with hashed_save.collecting() as pending:
        original(trainer, plan["write"], weights_only, storage_options)
    meta = _meta(trainer, "dcp" if folder else "file", weights_only)
    rank, world = trainer.global_rank, trainer.world_size
    plan["timing"] = _timing(started)
    if folder:  # for the record: where the sharded write ran (sprite run --checkpoint-writer)
        from sprite.runtime.ckpt import dcp_write

        plan["timing"]["writer"] = dcp_write.mode()
    durable.later(lambda: _complete(plan, target, meta, pending, rank, world, group))


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
    """Wrap ``Trainer.save_checkpoint``, ``ModelCheckpoint._remove_checkpoint`` and ``Trainer._teardown`` (the
    end of a fit waits for the save in flight), route Lightning's writes through sprite's, and read sharded
    checkpoints with sprite's reader (idempotent)."""
    from lightning.pytorch import Trainer
    from lightning.pytorch.callbacks import ModelCheckpoint

    hooks.wrap(Trainer, "save_checkpoint", save_checkpoint)
    hooks.wrap(ModelCheckpoint, "_remove_checkpoint", remove_checkpoint)
    from sprite.runtime.ckpt import dcp_read

    hashed_save.install()
    background.install()
    dcp_read.install()
