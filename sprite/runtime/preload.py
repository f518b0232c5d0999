"""Resume from a single-file checkpoint reading it from disk once: load it while its digests are checked.

Verifying before loading reads the whole checkpoint twice, the hashing from the disk and ``torch.load`` from the
page cache; on a fresh node, where a resume usually runs, that was 1.4x a plain cold ``torch.load`` of a 2 GB
file on an H200 host (benchmarks/checkpoint_io.py). For a candidate that is one file, each rank loads it on a
thread of its own while the ranks verify it (shared_verify), exactly as Lightning would load it (the strategy's
``TorchCheckpointIO.load_checkpoint`` with the fit's ``weights_only``), and Lightning's ``resume_start`` is handed
that object only if the checkpoint verified. A checkpoint that does not verify is never handed over (what was
loaded is dropped, and the next candidate is checked); a load that fails is dropped too, and Lightning loads
the checkpoint itself, as without sprite. Folders (torch.distributed.checkpoint) load through collectives
inside Lightning after the model is set up, so they are verified first and loaded afterwards, as before.
"""

from __future__ import annotations

import contextlib
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, Optional

from sprite import integrity
from sprite.runtime import shared_verify


def loader(strategy, weights_only) -> Optional[Callable]:
    """How Lightning 2.6.6 loads a checkpoint for ``strategy`` (``Strategy.load_checkpoint``: its checkpoint_io's
    ``load_checkpoint(path, weights_only=...)``, trainer/connectors/checkpoint_connector.py:83), or None when the
    strategy or its checkpoint_io is one that loads differently (FSDP, DeepSpeed, ModelParallel, a custom IO)."""
    from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
    from lightning.pytorch.strategies import Strategy

    if type(strategy).load_checkpoint is not Strategy.load_checkpoint:
        return None
    if type(getattr(strategy, "checkpoint_io", None)) is not TorchCheckpointIO:
        return None
    return lambda path: strategy.checkpoint_io.load_checkpoint(path, weights_only=weights_only)


class Checker:
    """The check ``ckpt_scan.pick`` runs on each candidate (every rank calls it for the same paths in the same
    order); keeps what was loaded of the last candidate that verified."""

    def __init__(self, strategy, load: Optional[Callable]) -> None:
        self.strategy, self.load = strategy, load
        self.path: Optional[str] = None
        self.loaded = None

    def __call__(self, path) -> integrity.Verdict:
        self.path, self.loaded = None, None
        if self.load is None or not os.path.isfile(path) or os.path.islink(path):
            return shared_verify.verify(self.strategy, path)
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="sprite-preload") as pool:
            future = pool.submit(self.load, os.fspath(path))
            verdict = shared_verify.verify(self.strategy, path)
            try:
                loaded = future.result()
            except Exception:  # Lightning loads it again itself and reports its own error
                loaded = None
        if verdict.valid and loaded is not None:
            self.path, self.loaded = os.path.realpath(path), loaded
        return verdict

    def take(self, path) -> object:
        """What was loaded while ``path`` verified (once), or None."""
        loaded = self.loaded if path is not None and os.path.realpath(path) == self.path else None
        self.path, self.loaded = None, None
        return loaded


@contextlib.contextmanager
def handed_over(strategy, path, loaded):
    """Inside the block, ``strategy.load_checkpoint(path, ...)`` returns ``loaded`` (once) instead of reading the
    file again; any other call, and every call after the block, is Lightning's own."""
    if loaded is None:
        yield
        return
    own, before = strategy.load_checkpoint, vars(strategy).get("load_checkpoint")
    box = [loaded]

    def load_checkpoint(checkpoint_path, weights_only=None):
        if box and os.path.realpath(checkpoint_path) == os.path.realpath(path):
            return box.pop()
        return own(checkpoint_path, weights_only=weights_only)

    strategy.load_checkpoint = load_checkpoint
    try:
        yield
    finally:
        if before is None:
            del strategy.load_checkpoint  # the instance attribute; the class's method is back
        else:
            strategy.load_checkpoint = before
