"""A warm pool: one launch of a harness's world whose ranks run arm after arm (issue 31; the rank side is
worker.py).

The host writes task n as DIR/task_<n>.json (write-once, renamed into place) and waits for every rank's
DIR/done_<n>_rank<r>.json. An arm's exit code is the first non-zero one of its ranks. The pool is spent, and
the caller runs the rest in fresh processes, when an arm failed, hung (past its time limit: the launch is stopped,
as a hung fresh launch is), left a leak the rank could not reset, or the launch ended early.
"""

from __future__ import annotations

import json
import os
import pathlib
import socket
import threading
import time

from sprite.integrity import owner_only
from sprite.parity.launch import launch

POLL_SECONDS = 0.02


def free_port() -> int:
    """A port free here now: every arm's process group gets its own rendezvous, so no rank can reach the store of
    the arm before (seen on 2 CPU ranks: a reused port hung the fourth arm's init_process_group)."""
    with socket.socket() as probe:
        probe.bind(("", 0))
        return probe.getsockname()[1]


class Pool:
    """One launch of ``world`` ranks (``fields``: job_fields of any arm of it) serving tasks from ``folder``."""

    def __init__(self, folder: pathlib.Path, fields: dict, world: int, log: pathlib.Path):
        from sprite.parity.pool import worker as pool_worker

        self.folder, self.world, self.log = folder, world, log
        owner_only.make_dirs(folder)
        self.fields = {**fields, "script": pool_worker.__file__,
                       "args": ["--dir", os.fspath(folder), "--host-pid", str(os.getpid())]}
        self.n, self.spent, self.reason, self.notes = 0, False, "", []
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

    def _write_task(self, task: dict) -> None:
        tmp = self.folder / f".task_{self.n}.tmp"
        tmp.write_text(json.dumps(task))
        os.replace(tmp, self.folder / f"task_{self.n}.json")

    def _done(self) -> list[dict] | None:
        """Every rank's record of the current arm; as soon as one rank failed, that one alone (its peers may
        wait for it in a collective: the pool is stopped)."""
        paths = [self.folder / f"done_{self.n}_rank{r}.json" for r in range(self.world)]
        records = [json.loads(p.read_text()) for p in paths if p.exists()]
        failed = [r for r in records if r["code"]]
        if failed and len(records) < self.world:
            self.stop(f"an arm failed (exit code {failed[0]['code']})")
            return failed
        return records if len(records) == self.world else None

    def submit(self, module: str, argv: list[str], log: pathlib.Path, strategy: str | None,
               limit: float | None) -> int | None:
        """Runs one arm on every rank: its exit code, or None when it ran past ``limit`` seconds (the pool is
        stopped then). A launch that ended before every rank reported gives its own exit code (1 if 0)."""
        owner_only.make_dirs(log.parent)
        env = {"MASTER_PORT": str(free_port())} if self.world > 1 else {}
        self._write_task({"module": module, "argv": argv, "log": os.fspath(log), "strategy": strategy, "env": env})
        deadline = None if limit is None else time.monotonic() + limit
        while (records := self._done()) is None:
            if not self.thread.is_alive() and (records := self._done()) is None:
                self._spend(self.reason or f"its launch ended with exit code {self.code} (see {self.log})")
                return self.code or 1
            if deadline is not None and time.monotonic() > deadline:
                self.stop(f"an arm ran past the time limit of {limit:g} s")
                with owner_only.open_log(log) as handle:
                    handle.write(f"sprite: stopped: still running after the time limit of {limit:g} s\n".encode())
                return None
            time.sleep(POLL_SECONDS)
        self.n += 1
        codes = [r["code"] for r in records]
        leaks = sorted({leak for r in records for leak in r["leaks"]})
        self.notes += sorted({c for r in records for c in r["changed"]})
        if leaks:
            self._spend("an arm left " + "; ".join(leaks))
        code = next((c for c in codes if c), 0)
        if code:
            self._spend(f"an arm failed (exit code {code})")
        return code

    def _spend(self, reason: str) -> None:
        if not self.spent:
            self.spent, self.reason = True, reason

    def release(self) -> None:
        """Tells the ranks to stop after the arm they run (none: a pool is released between arms); no wait."""
        if self.thread.is_alive() and not (self.folder / f"task_{self.n}.json").exists():
            tmp = self.folder / ".stop.tmp"
            tmp.write_text(json.dumps({"stop": True}))
            os.replace(tmp, self.folder / f"task_{self.n}.json")

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
