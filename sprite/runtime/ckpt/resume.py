"""``SPRITE_RESUME`` (``sprite run --resume auto|PATH|never``): resume the script's first ``Trainer.fit`` from a
checkpoint whose manifest verifies, with no change to the script.

The runtime passes a placeholder as ``fit(ckpt_path=...)``; Lightning hands it on untouched (an unknown string is
a path to it, trainer/connectors/checkpoint_connector.py:116-215) to ``resume_start`` (checkpoint_connector.py:67),
which runs after the process group exists (trainer/trainer.py:1033 before :1046/:1066). There rank 0 lists the
candidates, every rank hashes its share of each one checked (shared_verify), rank 0 decides, every rank gets the
choice by broadcast, and a refusal ends every rank with exit code 1.

The first sharded checkpoint (a folder) tried is loaded while its shard files are hashed (everything else in it
is verified first): a resume on a fresh node reads them from disk once instead of twice. If they do not match
their manifest once the load is over, the checkpoint is skipped as any invalid one is, and the next valid one is
loaded over what was loaded from it (``--resume PATH``: exit code 1).
"""

from __future__ import annotations

import glob
import os

from sprite import contract, integrity
from sprite.integrity import scan as ckpt_scan
from sprite.errors import UsageError
from sprite.integrity import IntegrityError
from sprite.runtime import hooks
from sprite.runtime import trail
from sprite.runtime.ckpt import shared_verify

PENDING = "sprite-resume:pending"  # fit(ckpt_path=PENDING) until resume_start resolves it


def mode(environ) -> str:
    """"never", "auto" or a checkpoint path, from ``SPRITE_RESUME`` (unset or empty: never)."""
    return environ.get(contract.RESUME, "").strip() or "never"


def checkpoint_dirs(trainer) -> list[str]:
    """Where the script's checkpoints go: each ModelCheckpoint's ``dirpath``, else Lightning's default folder
    (callbacks/model_checkpoint.py:837-865), whose ``version_N`` changes every run, so every version is searched;
    with no ModelCheckpoint, ``<default_root_dir>/checkpoints``, where a preemption save goes."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    dirs = []
    if not any(isinstance(callback, ModelCheckpoint) for callback in trainer.checkpoint_callbacks):
        dirs.append(os.path.join(trainer.default_root_dir, "checkpoints"))  # a preemption save's (preempt.py)
    for callback in trainer.checkpoint_callbacks:
        if not isinstance(callback, ModelCheckpoint):
            continue
        if callback.dirpath is not None:
            dirs.append(os.fspath(callback.dirpath))
        elif trainer.loggers:
            logger = trainer.loggers[0]
            save_dir = logger.save_dir if logger.save_dir is not None else trainer.default_root_dir
            dirs += sorted(glob.glob(os.path.join(glob.escape(save_dir), glob.escape(str(logger.name)), "*",
                                                  "checkpoints")))
        else:
            dirs.append(os.path.join(trainer.default_root_dir, "checkpoints"))
    return list(dict.fromkeys(dirs))


def _check(strategy, later: list, background: bool = True):
    """shared_verify for each candidate; with ``background``, the first folder's shard files are left to hash
    while it loads (its Pending goes into ``later``, and it counts as valid until then)."""
    def check(path) -> integrity.Verdict:
        pending = shared_verify.start(strategy, path, background=background and os.path.isdir(path) and not later)
        if pending.later:
            later.append(pending)
            return integrity.Verdict(True, "", pending.manifest)
        return pending.verdict()
    return check


def _auto(trainer, rejected: list, later: list) -> dict:
    strategy = trainer.strategy
    dirs = checkpoint_dirs(trainer)
    entries, found = strategy.broadcast(ckpt_scan.listed(dirs) if strategy.is_global_zero else None)
    entries = [entry for entry in entries if str(entry.path) not in rejected]  # reported when rejected
    chosen, skipped = ckpt_scan.pick(entries, _check(strategy, later, background=not rejected))
    if not strategy.is_global_zero:
        return {}  # rank 0's decision is broadcast
    for entry in skipped:
        trail.say(f"resume: skipped {entry.path}: {entry.reason}")
        trail.audit("checkpoint_skipped", path=str(entry.path), reason=entry.reason)
    where = ", ".join(dirs) or "nowhere (the Trainer has no ModelCheckpoint)"
    if chosen is not None:
        return _chosen(chosen) if not later else {"path": str(chosen.path), "later": True}
    if found == 0:
        trail.say(f"resume auto: no checkpoint in {where}; starting fresh")
        return {"path": None}
    named = "; ".join(f"{entry.path.name}: {entry.reason}" for entry in skipped)
    return {"error": (f"--resume auto found {found} checkpoint(s) in {where} and none is valid ({named}).",
                      "Every save was cut short or changed afterwards.",
                      "Pass --resume PATH with a checkpoint you trust, or --resume never to start fresh.")}


def _chosen(entry: ckpt_scan.Entry) -> dict:
    trail.say(f"resume: from {entry.path} (step {entry.step}, epoch {entry.epoch})")
    trail.audit("resume", path=str(entry.path), step=entry.step)
    return {"path": str(entry.path)}


def _refused(wanted: str, reason: str) -> dict:
    trail.audit("checkpoint_skipped", path=wanted, reason=reason)
    return {"error": (f"--resume {wanted}: the checkpoint is not valid: {reason.rstrip('.')}.",
                      "The save was cut short or the checkpoint was changed afterwards.",
                      "Pass another checkpoint, or --resume auto to take the newest valid one.")}


def _decide(trainer, wanted: str, rejected: list, later: list) -> dict:
    """Every rank takes part (the checkpoint is verified by all, shared_verify); rank 0's answer counts:
    ``{"path": str | None}``, with ``"later": True`` when its shard files are still being hashed (the Pending
    is in ``later`` on every rank), or ``{"error": (what, cause, fix)}``."""
    if wanted == "auto":
        return _auto(trainer, rejected, later)
    strategy = trainer.strategy
    verdict = _check(strategy, later)(wanted)
    if not strategy.is_global_zero:
        return {}
    if not verdict.valid:
        return _refused(wanted, verdict.reason)
    return {"path": wanted, "later": True} if later else _chosen(ckpt_scan.inspect(wanted, verify=False))


def resolve(trainer, wanted: str, rejected: list | None = None):
    """``(path, pending)``: the checkpoint path every rank resumes from (None for a fresh start), and the
    shared_verify.Pending still hashing its shard files (None when it is verified whole). ``rejected``: paths
    already found invalid, not tried again.

    Raises:
        IntegrityError: no valid checkpoint to resume from (every rank raises it; exit code 1).
    """
    later: list = []
    decision = trainer.strategy.broadcast(_decide(trainer, wanted, rejected or [], later))
    if "error" in decision:
        raise IntegrityError(*decision["error"])
    return decision["path"], (later[0] if decision.get("later") else None)


def _resume(resume_start, connector, wanted: str, weights_only):
    """``resume_start`` with the checkpoint :func:`resolve` picks; one whose shard files turn out not to match
    while it loads is skipped, and the next is loaded (every rank takes part). Loaded with ``weights_only=True``
    given outright, the one value ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD`` cannot turn off: a manifest is an unkeyed
    hash anyone can write again, so a checkpoint is never trusted to run code. Raises UsageError for a script's
    ``fit(weights_only=False)`` at once, before any checkpoint is looked at or hashed: under ``--resume auto`` the
    first attempt may find none, but the relaunch after a preemption would."""
    _weights_only(weights_only, wanted)
    trainer, rejected = connector.trainer, []
    while True:
        path, pending = resolve(trainer, wanted, rejected)
        if path is not None:
            weights_only = True
        if pending is None:
            return resume_start(connector, path, weights_only)
        failure = None
        try:
            result = resume_start(connector, path, weights_only)
        except BaseException as error:  # noqa: BLE001 - torch's CheckpointException is one; decided below
            if isinstance(error, (KeyboardInterrupt, SystemExit)):
                raise
            failure = error
        verdict = pending.verdict()
        if verdict.valid:
            if failure is not None:
                raise failure
            if trainer.strategy.is_global_zero:
                _chosen(ckpt_scan.inspect(path, verify=False))
            return result
        rejected.append(path)
        if wanted != "auto":
            raise IntegrityError(*trainer.strategy.broadcast(
                _refused(wanted, verdict.reason)["error"] if trainer.strategy.is_global_zero else None))
        if trainer.strategy.is_global_zero:
            trail.say(f"resume: skipped {path}: {verdict.reason}")
            trail.audit("checkpoint_skipped", path=path, reason=verdict.reason)


def _weights_only(given, wanted: str) -> None:
    """Raises UsageError when the script asked Lightning to load checkpoints with ``weights_only=False``."""
    if given is False:
        raise UsageError(f"The script calls Trainer.fit(weights_only=False) under --resume {wanted}: sprite loads "
                         "a checkpoint only with weights_only=True, since its pickle could run code.",
                         "weights_only=False is Lightning's way past torch's allow-list for objects such as "
                         "hyperparameters of other types.", "Drop weights_only=False and add those types with "
                         "torch.serialization.add_safe_globals, or run with --resume never.")


def install(wanted: str) -> None:
    """Route each Trainer's first ``fit`` through :func:`resolve` (nothing for "never"): a script of two stages, or
    a warm pool's next role, makes a Trainer of its own, and a later fit of the same Trainer goes on from where it
    is."""
    if wanted == "never":
        return
    from lightning.pytorch import Trainer
    from lightning.pytorch.trainer.connectors.checkpoint_connector import _CheckpointConnector

    def first_fit(fit, trainer, *args, **kwargs):
        given = kwargs.get("ckpt_path", args[4] if len(args) > 4 else None)
        if not getattr(trainer, "_sprite_resume_used", False):
            trainer._sprite_resume_used = True
            if given is not None:
                raise UsageError(f"The script calls Trainer.fit(ckpt_path={given!r}) and sprite was asked to"
                                 f" resume from {wanted!r}.", "Both choose the checkpoint to start from.",
                                 "Drop ckpt_path from the script, or run with --resume never.")
            kwargs["ckpt_path"] = PENDING
        return fit(trainer, *args, **kwargs)

    def resolving_start(resume_start, connector, checkpoint_path=None, weights_only=None):
        if checkpoint_path == PENDING:
            return _resume(resume_start, connector, wanted, weights_only)
        return resume_start(connector, checkpoint_path, weights_only)

    hooks.wrap(Trainer, "fit", first_fit)
    hooks.wrap(_CheckpointConnector, "resume_start", resolving_start)
