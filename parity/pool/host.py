"""A warm pool: one launch of a harness's world whose ranks run arm after arm (issue 31; the rank side is
worker.py).

Every rank r has its own queue, DIR/rank<r>/: the host writes its task n as task_<n>.json (renamed into place, so
a rank reads it whole) and waits for done_<n>.json. A distributed arm is one task in every rank's queue; a
one-process arm is a task in one rank's queue, so two of them run side by side on ranks 0 and 1. An arm's exit
code is the first non-zero one of its ranks. The pool is spent, and the caller runs the rest in fresh processes,
when an arm failed, hung (past its time limit: the launch is stopped, as a hung fresh launch is), left a leak the
rank could not reset, or the launch ended early.
"""

from __future__ import annotations

import json
import os
import pathlib
import socket
import threading
import time

from sprite.integrity import owner_only
from sprite.launch import rendezvous
from sprite.parity.launch import launch

POLL_SECONDS = 0.02
ENDED = -1000  # Pool.submit: the launch ended before the arm reported (another arm's failure or leak may have ended it)


class Pool:
    """One launch of ``world`` ranks (``fields``: job_fields of any arm of it) serving tasks from ``folder``."""

    def __init__(self, folder: pathlib.Path, fields: dict, world: int, log: pathlib.Path, name: str = ""):
        from sprite.parity.pool import worker as pool_worker

        self.folder, self.world, self.log, self.name = folder, world, log, name or folder.name
        for rank in range(world):
            owner_only.make_dirs(folder / f"rank{rank}")
        self.fields = {**fields, "script": pool_worker.__file__,
                       "args": ["--dir", os.fspath(folder), "--host-pid", str(os.getpid()),
                                "--host-name", socket.gethostname()]}
        self.next = [0] * world  # each rank's next task number
        self.arms, self.spent, self.reason = 0, False, ""
        self.cancel, self.code = threading.Event(), None
        self.thread = threading.Thread(target=self._launch, daemon=True)
        self.thread.start()

    def _launch(self) -> None:
        try:
            self.code = launch(self.fields, self.log, None, self.cancel)
        except InterruptedError:
            self.code = None
        except Exception as err:  # a launch that cannot start: the pool is spent, the arms go fresh
            self.code, self.reason = -1, f"the pool could not start ({err})"

    def _write(self, rank: int, task: dict) -> None:
        queue = self.folder / f"rank{rank}"
        tmp = queue / f".task_{self.next[rank]}.tmp"
        tmp.write_text(json.dumps(task))
        os.replace(tmp, queue / f"task_{self.next[rank]}.json")

    def _done(self, slots: list[tuple[int, int]]) -> list[dict] | None:
        """Every rank's record of the arm (``slots``: rank, task number); as soon as one rank failed, that one
        alone (its peers may wait for it in a collective: the pool is stopped)."""
        paths = [self.folder / f"rank{rank}" / f"done_{n}.json" for rank, n in slots]
        records = [json.loads(p.read_text()) for p in paths if p.exists()]
        failed = [r for r in records if r["code"]]
        if failed and len(records) < len(slots):
            self.stop(f"an arm failed (exit code {failed[0]['code']})")
            return failed
        return records if len(records) == len(slots) else None

    def submit(self, module: str, argv: list[str], log: pathlib.Path, limit: float | None, *,
               strategy: str | None = None, rank: int | None = None, threads: int = 0) -> int | None:
        """Runs one arm: on every rank (``rank`` None; a fresh rendezvous port, ``strategy`` for its Trainer) or
        on rank ``rank`` alone (``threads`` > 0: its torch threads). Returns its exit code, None when it ran
        past ``limit`` seconds (the pool is stopped then), or ``ENDED`` when the launch ended before every rank
        reported: a one-process arm running beside another whose failure or leak ended the rank it ran on (the
        supervisor then stops the other ranks) is not known to have failed, and the caller may run it again in
        fresh processes (``self.code`` is the launch's exit code)."""
        owner_only.make_dirs(log.parent)
        ranks = range(self.world) if rank is None else [rank]
        # every arm's process group gets its own rendezvous, so no rank can reach the store of the arm before (seen
        # on 2 CPU ranks: a reused port hung the fourth arm's init_process_group)
        env = {"MASTER_PORT": str(rendezvous.free_port())} if rank is None and self.world > 1 else {}
        task = {"module": module, "argv": argv, "log": os.fspath(log), "strategy": strategy, "env": env,
                "threads": threads}
        slots = [(r, self.next[r]) for r in ranks]
        for r in ranks:
            self._write(r, task)
            self.next[r] += 1
        deadline = None if limit is None else time.monotonic() + limit
        while (records := self._done(slots)) is None:
            if not self.thread.is_alive() and (records := self._done(slots)) is None:
                self._spend(self.reason or f"its launch ended with exit code {self.code} (see {self.log})")
                return ENDED
            if deadline is not None and time.monotonic() > deadline:
                self.stop(f"an arm ran past the time limit of {limit:g} s")
                with owner_only.open_log(log) as handle:
                    handle.write(f"sprite: stopped: still running after the time limit of {limit:g} s\n".encode())
                return None
            time.sleep(POLL_SECONDS)
        self.arms += 1
        leaks = sorted({leak for r in records for leak in r["leaks"]})
        if leaks:
            self._spend("an arm left " + "; ".join(leaks))
        code = next((r["code"] for r in records if r["code"]), 0)
        if code:
            self._spend(f"an arm failed (exit code {code})")
        return code

    def _spend(self, reason: str) -> None:
        if not self.spent:
            self.spent, self.reason = True, reason

    def release(self) -> None:
        """Tells the ranks to stop after the arm they run; no wait."""
        if self.thread.is_alive():
            for rank in range(self.world):
                self._write(rank, {"stop": True})

    def close(self, grace: float = 30.0) -> None:
        """Releases the ranks and waits ``grace`` seconds for the launch to end, then stops it."""
        self.release()
        self.thread.join(grace)
        self.stop()

    def stop(self, reason: str = "") -> None:
        """Stops the launch now (SIGTERM, then SIGKILL, to every rank) and waits for it; a ``reason`` spends
        the pool."""
        if reason:
            self._spend(reason)
        self.cancel.set()
        self.thread.join()
