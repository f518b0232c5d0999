"""Runs a parity check: claim a fresh DIR, launch every arm (then the negative controls) one after another."""

from __future__ import annotations

import os
import pathlib
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from rich.console import Console

from sprite.integrity import owner_only
from sprite.errors import UsageError
from sprite.parity.check import faults
from sprite.parity.launch import arm_overrides, launch_arm
from sprite.parity.pool.host import ENDED, Pool
from sprite.parity.progress import ProgressBoard, processes
from sprite.parity.settings import DISTRIBUTED_ARMS, SINGLE_ARMS, Settings, arm_world
from sprite.parity import store
from sprite.parity.store import ResultError
from sprite.parity.outdir import make_out


ARM_MODULE = "sprite.parity.check.arm"


def claim_dir(out: pathlib.Path, settings: Settings) -> None:
    """Creates ``out`` and writes run.json.

    Raises UsageError if ``out`` already holds anything, or if the distributed arms cannot be planned here
    (e.g. --nodes 2 outside an allocation): checked before anything is written.
    """
    from sprite.launch.plan import plan_run

    from sprite.parity.launch import arm_overrides

    plan_run(arm_overrides(out, "ddp", None, settings), fewest_ranks=2)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(f"--out {out} is not empty; refusing to run into it.",
                         "It holds an earlier run (arms never overwrite results).",
                         f"Pass a fresh directory, or recompute the old verdict with `sprite parity compare {out}`.")
    make_out(owner_only.make_dirs, out)  # 0700: results and logs inside are for their owner only
    store.write_settings(out, settings.to_json().encode(), store.PARITY)


def _label(arm: str, fault: str | None) -> str:
    return f"fault_{fault}/{arm}" if fault else arm


def _launch(out, arm, fault, settings, board: ProgressBoard, stamps: dict, threads: int = 0, pool=None,
            rank: int | None = None) -> int:
    """Runs one arm (in ``pool`` while it is not spent: a one-process arm on rank ``rank``; else in fresh
    processes); returns its exit code. Raises ResultError when it ran past settings.time_limit."""
    label = _label(arm, fault)
    log = out / "logs" / (f"fault_{fault}_{arm}.log" if fault else f"{arm}.log")
    board.start(label)
    wall = time.time()
    if pool is not None and not pool.spent:
        fields = arm_overrides(out, arm, fault, settings, threads)
        if arm in DISTRIBUTED_ARMS:
            code = pool.submit(ARM_MODULE, fields["args"], log, settings.time_limit, strategy=fields["strategy"])
        else:
            code = pool.submit(ARM_MODULE, fields["args"], log, settings.time_limit, rank=rank,
                               threads=int(fields["env"].get("OMP_NUM_THREADS", 0)))
        if code == ENDED:  # the pool's launch ended under it (Pool.submit): it runs again in fresh processes
            with owner_only.open_log(log) as handle:
                handle.write(f"sprite: the warm pool ended before this arm reported ({pool.reason}); it runs "
                             "again in fresh processes\n".encode())
            code = launch_arm(out, arm, fault, settings, log, threads, settings.time_limit)
    else:
        code = launch_arm(out, arm, fault, settings, log, threads, settings.time_limit)
    stamps[label] = (wall, time.time())
    if code is None:  # a hung arm ends the check instead of hanging it
        board.finish(label, False, f"not executed: timed out after {settings.time_limit:g} s")
        raise ResultError(f"Arm {label} not executed: timed out after {settings.time_limit:g} s.",
                          "It hung or runs slower than the limit (see its log); the check stopped there.",
                          f"Read {log}; for a slow machine or a large model raise --time-limit.")
    board.finish(label, code == 0, "" if code == 0 else f"exit code {code}, see {log}")
    return code


def _items(settings: Settings, cases: list) -> list[tuple[str, str]]:
    def kind(arm: str) -> str:
        return processes(arm_world(arm, settings))
    return [(arm, kind(arm)) for arm in settings.arms] + [(_label(a, f), kind(a)) for f, a in cases]


def run_arms(out: pathlib.Path, settings: Settings, console: Console, fresh: bool = False) -> dict[str, float]:
    """Launches the clean arms, then every fault case, showing their progress on ``console``; returns wall
    seconds per phase, under "launches" each arm's (start, end) wall-clock stamps, and under "pools" what each
    warm pool ran and why it was given up, if it was.

    The one-process arms run two at a time (independent processes, so their results do not change); the
    distributed arms run one after another. Unless ``fresh``, every arm runs in one warm pool (parity/pool/), a
    launch of the world: a distributed arm on every rank, a one-process arm on rank 0 or 1 with the threads its
    own launch would get. Once the pool is spent, the arms left run in fresh processes.
    Raises ResultError when a clean arm fails (nothing can be compared without it) or any arm runs past
    settings.time_limit seconds. A failed fault case is left for the comparison, which reports it as not executed.
    """
    cases = faults.cases(settings.faults)
    # Two one-process arms share the CPU: each gets half the cores, as Lightning gives each of two local ranks
    # (16-core H200 host, 2026-11-29: 16 OpenMP threads each made a 0.5B-shape arm ~20x slower).
    threads = max(1, (os.cpu_count() or 2) // 2)
    pools = {} if fresh else {"world": _start_pool(out, settings)}
    try:
        with ProgressBoard(console, _items(settings, cases), "parity arms") as board:
            times = _run(out, settings, board, cases, threads, pools.get("world"))
    except BaseException:
        for pool in pools.values():
            pool.stop()  # nothing of a stopped check keeps running
        raise
    for pool in pools.values():
        # Its ranks exit while the comparison runs (the launch's teardown took 11 s on 2 loaded cores); the
        # thread is not a daemon, so sprite still waits for them before it exits.
        pool.release()
        threading.Thread(target=pool.close, name="parity-pool-close").start()
    times["pools"] = {name: {"arms": pool.arms, "given_up": pool.reason} for name, pool in pools.items()}
    for pool in pools.values():
        if pool.reason:
            console.print(f"warm pool given up after {pool.arms} arm(s): {pool.reason}; the rest ran in fresh "
                          "processes")
    return times


def _start_pool(out: pathlib.Path, settings: Settings):
    return Pool(out / "logs" / "pool", arm_overrides(out, "ddp", None, settings), settings.world,
                out / "logs" / "pool.log")


def _run(out, settings, board, cases, threads, world) -> dict:
    times, stamps = {}, {}
    start = time.monotonic()
    todo = queue.SimpleQueue()
    for arm in settings.arms:
        if arm in SINGLE_ARMS:
            todo.put(arm)

    def serve(rank: int) -> dict:
        codes = {}
        while True:
            try:
                arm = todo.get_nowait()
            except queue.Empty:
                return codes
            codes[arm] = _launch(out, arm, None, settings, board, stamps, threads, world, rank)

    with ThreadPoolExecutor(max_workers=2) as workers:
        codes = {}
        for future in [workers.submit(serve, rank) for rank in range(2)]:
            codes.update(future.result())
    for arm in settings.arms:
        if arm not in codes:
            codes[arm] = _launch(out, arm, None, settings, board, stamps, pool=world)
        if codes[arm] != 0:
            raise ResultError(f"Arm {arm} failed, so the run has no verdict.",
                              "The arm's processes exited non-zero (its log names the error).",
                              f"Read {out / 'logs' / (arm + '.log')}, fix the cause, and run into a fresh --out.")
    times["clean_arms_s"] = time.monotonic() - start
    start = time.monotonic()
    for fault, arm in cases:
        _launch(out, arm, fault, settings, board, stamps, pool=world)
    times["fault_arms_s"] = time.monotonic() - start
    times["launches"] = stamps
    return times
