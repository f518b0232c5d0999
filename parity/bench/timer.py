"""Timing a rank's steps in windows: the device is synchronised (through the runtime's device table) only at the
end of warm-up and at the end of each window, never inside one.

A synchronisation every step stalls the host until the device drains its queue, which hides the overlap of
host-side launch work with device work: on an H200 that added ~15% to a launch-bound step (FACTS.md,
2026-11-29). A window of K steps pays that once per K steps. ``--window 1`` gives per-step times.
"""

from __future__ import annotations

import time


class LoaderClock:
    """Wraps an iterable of batches and adds up the seconds spent fetching from it (the data-loading time)."""

    def __init__(self, loader):
        self.loader, self.seconds = loader, 0.0

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        iterator = iter(self.loader)
        while True:
            start = time.perf_counter()
            try:
                batch = next(iterator)
            except StopIteration:
                return
            finally:
                self.seconds += time.perf_counter() - start
            yield batch


class StepTimer:
    """Records one entry per timed window: mode, batch, steps, seconds, and seconds spent in the loader.

    Call ``step_end(index)`` after every step (index from 0); the device is synchronised at the end of every
    window of ``phases`` (bench_settings), timed or not, and nowhere else. Peak memory is read at the end of the
    first synced window, before any no-sync window (whose unsynchronised gradients FSDP2 keeps unsharded) or
    probe window (twice the batch) can raise it.
    """

    def __init__(self, kind, device, phases, clock: LoaderClock):
        self.kind, self.device, self.clock = kind, device, clock
        self.ends, last = {}, -1
        for window in phases:
            last += window.steps
            self.ends[last] = window
        self.timed = sum(window.timed for window in phases)
        self.records: list[dict] = []
        self.memory: dict | None = None
        self.memory_read = False
        self._mark = None

    def step_end(self, index: int) -> None:
        if index not in self.ends:
            return
        self.kind.synchronize(self.device)
        now, loaded = time.perf_counter(), self.clock.seconds
        window = self.ends[index]
        if window.timed:
            start, start_loaded = self._mark
            self.records.append({"mode": window.mode, "batch": window.batch, "steps": window.steps,
                                 "seconds": now - start, "loader_seconds": loaded - start_loaded})
            if window.mode == "sync" and not self.memory_read:
                self.memory, self.memory_read = self.kind.peak_memory(self.device), True
        self._mark = (time.perf_counter(), self.clock.seconds)

    @property
    def done(self) -> bool:
        return len(self.records) == self.timed
