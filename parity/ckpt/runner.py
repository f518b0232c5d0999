"""Runs a checkpoint check: claim a fresh DIR, then every launch once the launches it reads from have finished.

Launch slots (``--slots``, default 2): a one-process launch takes one, a distributed launch two, so by default
one-process roles run two at a time (independent processes: their results do not change) as the parity runner's
single-device arms do, and a distributed one alone; more slots run independent launches side by side. A
launch that fails leaves its dependants skipped; a launch that runs past the time limit ends the check: the
other running launch is stopped and nothing new starts. Each launch's outcome goes to DIR/launches/KEY.json.

Warm pools (issue 31; parity/pool/): unless ``fresh``, one launch of the check's world and two one-process
launches start once and run role after role, each role a fresh Trainer and process group in a process whose RNG
states, environment and defaults are put back after every role. The ``killed`` roles always get fresh processes:
they end by their own SIGKILL. A role that finds no idle pool of its size (more slots than pools), or a pool that
was given up (a failed or hung role, a leak), runs in fresh processes, as every role did before the pools.
"""

from __future__ import annotations

import json
import os
import pathlib
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

from rich.console import Console

from sprite import integrity
from sprite.integrity import owner_only
from sprite.errors import UsageError
from sprite.parity import store
from sprite.parity.ckpt.roles import Launch, launches, result_dir
from sprite.parity.ckpt.settings import CkptSettings
from sprite.parity.launch import job_fields, launch
from sprite.parity.pool.host import ENDED, Pool
from sprite.parity.progress import ProgressBoard, processes
from sprite.parity.outdir import make_out

WIDE = 2  # slots a distributed launch takes
PRIORITY = {"killed": 0, "resume": 1, "reshard": 1, "export": 1, "reload": 2, "fit": 3, "twin": 3}


def overrides(out: pathlib.Path, item: Launch, settings: CkptSettings, threads: int = 0) -> dict:
    """What `sprite run` would be given for ``item``: the worker script and its arguments, the launch's world,
    strategy, precision and accelerator. ``threads`` > 0 caps a one-process launch's CPU threads."""
    from sprite.parity.ckpt import worker as ckpt_worker

    return job_fields(ckpt_worker.__file__, ["--out", os.fspath(out), "--launch", item.key], devices=item.devices,
                      nodes=item.nodes, strategy=item.strategy, precision=settings.precision,
                      accelerator=settings.accelerator, threads=threads)


def claim_dir(out: pathlib.Path, settings: CkptSettings) -> None:
    """Creates ``out`` and writes run.json there, sealed.

    Raises UsageError when ``out`` exists (a used --out is refused, even if empty) or the distributed launches
    cannot be planned here (e.g. --nodes 2 outside an allocation): checked before anything is written.
    """
    from sprite.launch.plan import plan_run

    distributed = next(item for item in launches(settings) if item.key == "ddp-fit")
    plan_run(overrides(out, distributed, settings), fewest_ranks=2)
    if os.path.lexists(out):
        raise UsageError(f"--out {out} exists already; refusing to run into it.",
                         "It holds an earlier check (results are never overwritten).",
                         f"Pass a new directory, or recompute the old verdict with `sprite ckpt-check compare {out}`.")
    make_out(lambda path: (owner_only.make_dirs(path.parent), integrity.make_dir_new(path)), out)
    store.write_settings(out, settings.to_json().encode(), store.CKPT_CHECK)


def _record(out: pathlib.Path, key: str, **outcome) -> None:
    owner_only.make_dirs(out / "launches")
    integrity.write_new(out / "launches" / f"{key}.json", json.dumps({"key": key, **outcome}, indent=1).encode())


def board(pending: list[Launch], console: Console, limit_s: float) -> ProgressBoard:
    """The progress display of `sprite parity` with a row per launch (its processes as its kind)."""
    items = [(item.key, processes(item.processes)) for item in pending]
    return ProgressBoard(console, items, f"ckpt-check launches (time limit {limit_s:g} s each)")


WORKER_MODULE = "sprite.parity.ckpt.worker"


class Pools:
    """The check's warm pools by size (processes), each lent to one role at a time."""

    def __init__(self, out: pathlib.Path, settings: CkptSettings, threads: int):
        table = launches(settings)
        world = next(item for item in table if item.key == "ddp-fit")
        one = next(item for item in table if item.key == "single-fit")
        self.lock, self.idle, self.all = threading.Lock(), {}, []
        for name, item, size in (("world", world, world.processes), ("one-a", one, 1), ("one-b", one, 1)):
            pool = Pool(out / "logs" / f"pool-{name}", overrides(out, item, settings, threads if size == 1 else 0),
                        size, out / "logs" / f"pool-{name}.log", name)
            self.all.append(pool)
            self.idle.setdefault(size, []).append(pool)

    def take(self, item: Launch):
        """An idle pool for ``item`` (None: the role runs in fresh processes)."""
        if item.role == "killed":
            return None
        with self.lock:
            free = [pool for pool in self.idle.get(item.processes, []) if not pool.spent]
            if free:
                self.idle[item.processes].remove(free[0])
            return free[0] if free else None

    def give_back(self, pool) -> None:
        with self.lock:
            self.idle[pool.world].append(pool)

    def stop(self) -> None:
        for pool in self.all:
            pool.stop()

    def close(self) -> dict:
        """Releases every pool (in the background) and says what each ran and why it was given up, if it was."""
        for pool in self.all:
            pool.release()
            threading.Thread(target=pool.close, name="ckpt-pool-close", daemon=True).start()
        return {pool.name: {"roles": pool.arms, "given_up": pool.reason} for pool in self.all}


def _run_in(pool, out, item: Launch, settings, threads, cancel) -> int | None | str:
    """One role in ``pool`` (or fresh processes when None): its exit code, None past the time limit, or
    "cancelled" when the check ended first."""
    log = out / "logs" / f"{item.key}.log"
    if pool is None:
        try:
            return launch(overrides(out, item, settings, threads if item.processes == 1 else 0), log,
                          settings.time_limit, cancel)
        except InterruptedError:
            return "cancelled"  # the check ended: another launch timed out, or Ctrl-C / SIGTERM
    if cancel.is_set():
        return "cancelled"
    argv = ["--out", os.fspath(out), "--launch", item.key]
    code = pool.submit(WORKER_MODULE, argv, log, settings.time_limit, strategy=item.strategy,
                       threads=threads if item.processes == 1 else 0)
    # a pool stopped because the check ended (another role timed out, Ctrl-C) ends its role as a launch would
    if code and cancel.is_set():
        return "cancelled"
    return (pool.code or 1) if code == ENDED else code  # its pool is its own launch: the launch's own code


def _one(out, item: Launch, settings, display, cancel, threads, pools=None) -> tuple[str, int | None]:
    display.start(item.key)
    start, started = time.monotonic(), time.time()
    pool = pools.take(item) if pools is not None else None
    try:
        code = _run_in(pool, out, item, settings, threads, cancel)
    finally:
        if pool is not None:
            pools.give_back(pool)
    seconds = round(time.monotonic() - start, 1)
    _record(out, item.key, exit_code=code if isinstance(code, int) else None, timed_out=code is None,
            cancelled=code == "cancelled", limit_s=settings.time_limit, seconds=seconds, started=started,
            ended=time.time(), pool=pool.name if pool is not None else None)
    # The killed fit ends by its own SIGKILL, after sealing its result: any exit code but 0, and a sealed result.
    sealed = integrity.manifest_path(out / result_dir(item.arm, item.role)).is_file()
    ok = isinstance(code, int) and ((code != 0 and sealed) if item.role == "killed" else code == 0)
    note = ("" if ok else "not executed: timed out after {:g} s".format(settings.time_limit) if code is None
            else "stopped: the check ended" if code == "cancelled" else f"exit code {code}")
    display.finish(item.key, ok, note)
    return ("ok" if ok else "timeout" if code is None else "failed"), code


def _next(ready: list[Launch], free: int) -> list[Launch]:
    """Launches to start now in ``free`` slots: a distributed one (two slots) while two slots are free and fewer
    than two one-process ones wait, else one-process ones (one slot each)."""
    singles = [item for item in ready if item.processes == 1]
    wide = [item for item in ready if item.processes > 1]
    picked = []
    while free:
        if wide and free >= WIDE and len(singles) < 2:
            picked.append(wide.pop(0))
            free -= WIDE
        elif singles:
            picked.append(singles.pop(0))
            free -= 1
        else:
            break
    return picked


def run_launches(out: pathlib.Path, settings: CkptSettings, console: Console, fresh: bool = False) -> dict:
    """Runs every launch (in warm pools unless ``fresh``); returns ``{"wall_s": ..., "outcomes": {key:
    "ok"|"failed"|"timeout"|"skipped"}, "pools": {name: {"roles": n, "given_up": reason}}}``."""
    pending = sorted(launches(settings), key=lambda item: PRIORITY[item.role])
    outcomes, running, cancel = {}, {}, threading.Event()
    threads = max(1, (os.cpu_count() or 2) // settings.slots)  # one-process launches share the cores
    start = time.monotonic()
    pools = None if fresh else Pools(out, settings, threads)
    used = {}
    with board(pending, console, settings.time_limit) as display, ThreadPoolExecutor(settings.slots) as pool:
        try:
            _loop(out, settings, display, pool, pending, running, outcomes, cancel, threads, pools)
        except BaseException:  # Ctrl-C or SIGTERM: the launches still running stop with everything they started
            cancel.set()
            if pools is not None:
                pools.stop()
            raise
        finally:
            if pools is not None:
                used = pools.close()
    for name, what in used.items():
        if what["given_up"]:
            console.print(f"warm pool {name} given up after {what['roles']} role(s): {what['given_up']}; the rest "
                          "ran in fresh processes")
    return {"wall_s": round(time.monotonic() - start, 1), "outcomes": outcomes, "pools": used}


def _skip(out, pending, outcomes, cancel, display) -> None:
    """Takes out of ``pending`` every launch that can no longer run, recording why."""
    for item in [i for i in pending if cancel.is_set() or any(outcomes.get(d, "ok") != "ok" for d in i.after)]:
        pending.remove(item)
        outcomes[item.key] = "skipped"
        reason = "the check ended before it started" if cancel.is_set() else "a launch it needs failed"
        _record(out, item.key, skipped=reason)
        display.skip(item.key, reason)


def _loop(out, settings, display, pool, pending, running, outcomes, cancel, threads, pools=None) -> None:
    """Starts launches as slots and their inputs allow, until every launch has an outcome."""
    while pending or running:
        _skip(out, pending, outcomes, cancel, display)
        ready = [item for item in pending if all(d in outcomes for d in item.after)]
        used = sum(WIDE if item.processes > 1 else 1 for item in running.values())
        for item in _next(ready, settings.slots - used):
            pending.remove(item)
            running[pool.submit(_one, out, item, settings, display, cancel, threads, pools)] = item
        if running:
            for future in wait(running, return_when=FIRST_COMPLETED).done:
                status, _ = future.result()
                outcomes[running.pop(future).key] = status
                if status == "timeout":
                    cancel.set()
                    if pools is not None:  # a role still running in a pool stops with it
                        pools.stop()
        elif pending:  # nothing can start (a cycle in the table): say so instead of spinning
            raise RuntimeError(f"no launch can start: {[item.key for item in pending]}")
