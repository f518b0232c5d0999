"""Save and restore every rank's random state and its place in the epoch, so a resumed fit continues bit for bit.

Lightning 2.6.6 saves no random state, and on a mid-epoch resume it re-creates the epoch's iterator once
(loops/fit_loop.py:276) and never again for that epoch (loops/training_epoch_loop.py:245-246), so the data starts
over from the epoch's first batch while the batch counter continues (the warning at training_epoch_loop.py:218-227
says so). What a resumed run must replay, per rank:

- the generators (python ``random``, numpy, torch, the device's through the device table) at the moment this
  epoch's iterator was created: ``DataLoader.__iter__`` draws a base seed and ``RandomSampler`` draws its
  permutation seed from the global torch generator (``DistributedSampler`` uses seed + epoch and draws nothing);
- the batches already trained in this epoch, fetched again and dropped (after Lightning has set the sampler's
  epoch: the skip waits for the first real fetch);
- the generators just before each batch that was fetched but not yet trained (a prefetch), and finally the
  generators at the save.

A sprite callback keeps this in the checkpoint (``callbacks["SpriteResumeState"]``; all ranks' states, gathered
into rank 0's file) as tensors and plain numbers, so ``torch.load(weights_only=True)`` reads it.
"""

from __future__ import annotations

import collections
import random

import numpy as np
import torch
from lightning.pytorch.callbacks import Callback

from sprite.runtime import allranks

from sprite.runtime import hooks

from sprite.runtime import trail
from sprite.runtime.devices import device_type

KEY = "SpriteResumeState"


def capture(device: str) -> dict:
    """Every generator's state on this rank (python, numpy, torch, the device's) as weights_only-safe values."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {"python": random.getstate(), "torch": torch.get_rng_state(), "device": device_type(device).rng_state(),
            "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), int(pos), int(has_gauss), float(cached)]}


def restore(state: dict, device: str) -> None:
    """Put back what :func:`capture` returned."""
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(state["torch"])
    device_type(device).set_rng_state(state["device"])


class _Counted:
    """The training iterator of one epoch: counts fetches, keeps the generators' state before the latest ones,
    and on a resume replays the saved position at its first fetch."""

    def __init__(self, inner, device: str, replay: dict | None):
        self.inner, self.device, self.replay = inner, device, replay
        self.fetched, self.pending, self.now = 0, [], None
        self.before: collections.deque = collections.deque(maxlen=4)  # (fetch number, state before it)

    def __iter__(self):
        return self

    def __next__(self):
        if self.replay is not None:
            self._skip(self.replay)
        if self.pending:
            restore(self.pending.pop(0), self.device)
        self.before.append((self.fetched + 1, capture(self.device)))
        item = next(self.inner)
        self.fetched += 1
        if self.now is not None and not self.pending:
            restore(self.now, self.device)
            self.now = None
        return item

    def _skip(self, saved: dict) -> None:
        """Fetch and drop the batches already trained, then line up the untrained fetches and the save's state."""
        self.replay, self.pending, self.now = None, list(saved["before"]), saved["now"]
        for _ in range(saved["trained"]):
            next(self.inner)
            self.fetched += 1
        if not self.pending:
            restore(self.now, self.device)
            self.now = None


class ResumeState(Callback):
    """Puts each rank's generators and epoch position into checkpoints and replays them on a resume."""

    def __init__(self):
        self.trainer = None
        self.loaded = None  # this rank's state from the checkpoint being resumed, until its epoch iterator exists
        self.epoch_start = None
        self.iterator: _Counted | None = None

    @property
    def state_key(self) -> str:
        return KEY

    def setup(self, trainer, pl_module, stage) -> None:
        self.trainer = trainer
        _ACTIVE[:] = [self]

    def teardown(self, trainer, pl_module, stage) -> None:
        _ACTIVE[:] = [cb for cb in _ACTIVE if cb is not self]

    def _device(self) -> str:
        return self.trainer.strategy.root_device.type

    def state_dict(self) -> dict:
        """Every rank's state (a collective: Lightning builds checkpoints on every rank)."""
        trainer = self.trainer
        if trainer is None or self.iterator is None:
            return {}
        trained = trainer.fit_loop.epoch_loop.batch_progress.current.processed
        mine = {"epoch_start": self.epoch_start, "trained": trained, "now": capture(self._device()),
                "before": [state for number, state in self.iterator.before if number > trained],
                "epoch_done": trained >= trainer.num_training_batches}
        return {"world_size": trainer.world_size, "ranks": allranks.gather(mine)}

    def load_state_dict(self, state_dict: dict) -> None:
        ranks, rank = state_dict.get("ranks") or [], self.trainer.global_rank
        if ranks and len(ranks) != self.trainer.world_size and rank == 0:
            trail.say(f"the checkpoint was saved by {len(ranks)} ranks and resumes on {self.trainer.world_size}:"
                           " random state and data position are restored only for the ranks both have")
        self.loaded = ranks[rank] if rank < len(ranks) else None

    def around_iter(self, fetcher, original):
        """Create this epoch's training iterator, from the saved generators when resuming."""
        saved, self.loaded = self.loaded, None
        if saved is not None and saved["epoch_done"]:
            restore(saved["now"], self._device())
            saved = None
        elif saved is not None and saved["epoch_start"] is not None:
            restore(saved["epoch_start"], self._device())
        self.epoch_start = capture(self._device())
        result = original(fetcher)
        fetcher.iterator = self.iterator = _Counted(fetcher.iterator, self._device(), saved)
        return result


_ACTIVE: list = []  # the ResumeState of the Trainer that is fitting now


def _iterate(iterate, fetcher):
    active = _ACTIVE[0] if _ACTIVE else None
    if active is None or active.trainer is None or fetcher is not active.trainer.fit_loop._data_fetcher:
        return iterate(fetcher)
    return active.around_iter(fetcher, iterate)


def _with_resume_state(on_trainer_init, connector, *args, **kwargs):
    on_trainer_init(connector, *args, **kwargs)
    connector.trainer.callbacks.append(ResumeState())


def install() -> None:
    """Give every Trainer a ResumeState callback and route its training fetcher's iterator through it."""
    from lightning.pytorch.loops import fetchers
    from lightning.pytorch.trainer.connectors.callback_connector import _CallbackConnector

    hooks.wrap(fetchers._DataFetcher, "__iter__", _iterate)
    hooks.wrap(_CallbackConnector, "on_trainer_init", _with_resume_state)
