"""One file from an FSDP2 sharded checkpoint, in the layout a 1-device Lightning fit resumes from.

Lightning's ModelParallelStrategy (and sprite's FSDP2Strategy on it) saves a torch.distributed.checkpoint folder:
the shards hold ``state_dict`` and ``optimizer_<i>`` (AdamW state keyed by parameter name), ``meta.pt`` the rest
(loops, LR schedulers, epoch, ...). Lightning's own tool, ``python -m lightning.pytorch.utilities.
consolidate_checkpoint``, expects FSDP1's layout and fails on it with ``KeyError: 'model'`` (Lightning 2.6.6
pytorch/utilities/consolidate_checkpoint.py:13). Here the optimizer states are keyed by position again, as
``torch.optim.Optimizer.state_dict`` keys them. torch is imported only inside ``consolidate``.
"""

from __future__ import annotations

import io
import os
import pathlib

from sprite import integrity
from sprite.errors import UsageError

METADATA = "meta.pt"  # Lightning 2.6.6 fabric/utilities/load.py:33 (_METADATA_FILENAME)


def _by_position(state: dict) -> dict:
    """An optimizer state keyed by parameter name -> keyed 0, 1, ... in param-group order (Optimizer.state_dict)."""
    index: dict[str, int] = {}
    groups = []
    for group in state["param_groups"]:
        groups.append({**group, "params": [index.setdefault(name, len(index)) for name in group["params"]]})
    unknown = sorted(set(state["state"]) - set(index))
    if unknown:
        raise UsageError(f"The optimizer state names {unknown[0]}, which no param group lists.",
                         "The checkpoint was not written by Lightning's ModelParallelStrategy.",
                         "Consolidate a checkpoint folder saved by sprite's FSDP2Strategy or Lightning's"
                         " ModelParallelStrategy.")
    return {"state": {index[name]: value for name, value in state["state"].items()}, "param_groups": groups}


def _check(source: pathlib.Path, out: pathlib.Path) -> bool:
    """Returns whether ``source`` carries a sprite manifest (which then verified).

    Raises UsageError for a source that is not a sharded Lightning checkpoint or an ``out`` that exists;
    IntegrityError when the source's manifest does not verify.
    """
    if os.path.lexists(out):
        raise UsageError(f"{out} exists already.", "consolidate never writes over a file.", "Pass a new OUT path.")
    if not out.parent.is_dir():
        raise UsageError(f"The folder of {out} does not exist.", "", "Create it first, or pass another OUT path.")
    if not (source / ".metadata").is_file() or not (source / METADATA).is_file():
        raise UsageError(f"{source} is not a sharded Lightning checkpoint (no .metadata and {METADATA} in it).",
                         "It is a file checkpoint already, or not a checkpoint folder.",
                         "Pass a folder saved by FSDP2Strategy/ModelParallelStrategy with save_distributed_checkpoint"
                         "=True.")
    _outside_checkpoints(source, out)
    problem = _metadata_problem(source / ".metadata")
    if problem:
        raise UsageError(f"{source / '.metadata'} is refused, never unpickled: {problem}.", "torch's own"
                         " checkpoint metadata holds only torch's metadata classes: the folder was crafted or"
                         " damaged.", "Consolidate only a checkpoint folder you trust.")
    sealed = os.path.lexists(integrity.manifest_path(source))
    if sealed:
        verdict = integrity.verify(source)
        if not verdict.valid:
            raise integrity.IntegrityError(f"{source} does not match its manifest: {verdict.reason}.",
                                           "A shard was changed or lost after the save.", "Use another checkpoint.")
    return sealed


def _outside_checkpoints(source: pathlib.Path, out: pathlib.Path) -> None:
    """Raises UsageError when ``out`` would land inside ``source`` or inside any sealed checkpoint folder: the
    folder would then hold a file its manifest does not list, and no longer verify (--resume auto would skip a
    good checkpoint)."""
    where = pathlib.Path(os.path.realpath(out.parent))
    inside = next((folder for folder in (where, *where.parents)
                   if os.path.lexists(folder / integrity.MANIFEST_NAME)), None)
    if inside is not None or where == pathlib.Path(os.path.realpath(source)) or \
            pathlib.Path(os.path.realpath(source)) in where.parents:
        what = f"the sealed checkpoint {inside}" if inside is not None else f"the checkpoint {source}"
        raise UsageError(f"{out} is inside {what}.", "A file added to a checkpoint folder makes it no longer"
                         " match its manifest (a later --resume auto would skip it).",
                         "Pass an OUT outside every checkpoint folder.")


def _metadata_problem(path: pathlib.Path) -> str:
    """Why ``.metadata`` must not be unpickled ("" when it holds torch's metadata classes only); torch-free."""
    from sprite.integrity import dcp_metadata, records

    try:
        return dcp_metadata.check(records.read(path, dcp_metadata.METADATA_MAX))
    except OSError as err:
        return err.strerror or str(err)


def consolidate(source, out) -> dict:
    """Writes ``out`` (a new file, then its sprite manifest beside it) from the sharded checkpoint ``source``.

    Returns what was done: source, out, whether the source was sealed, bytes written. Raises UsageError (see
    ``_check``; also when ``meta.pt`` holds more than plain data) and IntegrityError (source manifest invalid,
    or ``out`` appeared meanwhile).
    """
    source, out = pathlib.Path(source), pathlib.Path(out)
    sealed = _check(source, out)
    import pickle

    import torch

    from sprite.runtime.ckpt import dcp_read

    try:  # plain data only: a checkpoint is not trusted to run code
        metadata = torch.load(source / METADATA, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        raise UsageError(f"{source / METADATA} holds objects beyond tensors and plain data.",
                         f"torch.load(weights_only=True) refused it: {str(err).splitlines()[0]}",
                         "Consolidate only checkpoints you trust, with their classes allow-listed"
                         " (torch.serialization.add_safe_globals).") from None
    try:
        sharded = dcp_read.load_whole(source)  # neither .metadata nor a stored value runs code
    except BaseException as err:  # torch's CheckpointException (a BaseException) wraps a refused stored value
        if isinstance(err, (KeyboardInterrupt, SystemExit, integrity.IntegrityError)) or \
                "UnpicklingError" not in str(err):
            raise
        raise UsageError(f"{source} stores a value beyond tensors and plain data.", "torch.load(weights_only=True)"
                         " refused it.", "Consolidate only checkpoints you trust.") from None
    optimizers = sorted((key for key in sharded if key.startswith("optimizer_")), key=lambda k: int(k.split("_")[1]))
    checkpoint = {**metadata, "state_dict": sharded["state_dict"],
                  "optimizer_states": [_by_position(sharded[key]) for key in optimizers]}
    buffer = io.BytesIO()
    torch.save(checkpoint, buffer)
    integrity.write_new(out, buffer.getbuffer())
    integrity.seal(out, {"consolidated_from": source.name, "source_sealed": sealed})
    return {"source": str(source), "out": str(out), "source_sealed": sealed, "bytes": buffer.getbuffer().nbytes}
