"""A warm pool rank: ``python -m sprite.runtime <this file> --dir D --host-pid P`` on every rank of one launch.

It runs arm after arm inside this process (the host side is host.py). Task n of rank r is the file
D/rank<r>/task_<n>.json: the arm worker module to run, its argv, its log, the Trainer strategy, environment
(a rendezvous port) and torch threads. The rank runs it, then writes D/rank<r>/done_<n>.json with the exit code
and what isolation.reset had to put back. After an arm the process group is ended on every rank
(sprite.runtime.finish), so the next Trainer makes a fresh one; RNG states, the environment and the global
defaults go back to the pool's first state. A failed arm or a leak that cannot be
reset ends this rank (the host runs the rest in fresh processes); so does a stop task, a host that is gone, or
no task for IDLE_SECONDS.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib
import json
import os
import pathlib
import socket
import sys
import time
import traceback

IDLE_SECONDS = 1800.0
POLL_SECONDS = 0.02


def _host_alive(pid: int) -> bool:
    """Whether sprite (process ``pid`` of this machine; 0: on another node, not checked) still runs."""
    if not pid:
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _next_task(folder: pathlib.Path, n: int, host_pid: int) -> dict | None:
    """Task n once it is written; None for a stop, a host that is gone, or a long idle."""
    path, start, checked = folder / f"task_{n}.json", time.monotonic(), 0.0  # folder: this rank's queue
    while not path.exists():
        now = time.monotonic()
        if now - start > IDLE_SECONDS:
            return None
        if now - checked > 1.0:
            checked = now
            if not _host_alive(host_pid):
                return None
        time.sleep(POLL_SECONDS)
    for _ in range(100):  # written under a temporary name and renamed, so a read sees it whole
        with contextlib.suppress(ValueError):
            task = json.loads(path.read_text())
            return None if task.get("stop") else task
        time.sleep(POLL_SECONDS)
    return None


@contextlib.contextmanager
def _output_to(log: str):
    """This rank's stdout and stderr appended to ``log`` (the arm's own log, as a fresh launch writes)."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    try:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for handle in (fd, *saved):
            os.close(handle)


def _use_strategy(strategy: str | None) -> None:
    """Makes the next Trainer launch ``strategy`` (the pool was launched with one arm's; fsdp follows ddp)."""
    if not strategy:
        return
    from lightning.pytorch import Trainer

    from sprite.runtime import trainer_wrap

    launched = getattr(Trainer.__init__, "_sprite_launch", None)
    if launched is not None and launched.strategy != strategy:
        trainer_wrap.install(dataclasses.replace(launched, strategy=strategy))


def _run(task: dict) -> int:
    try:
        _use_strategy(task.get("strategy"))
        code = importlib.import_module(task["module"]).main(task["argv"])
        return int(code or 0)
    except SystemExit as stop:
        return stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    except BaseException:  # as a fresh rank would: the traceback in the arm's log, a non-zero exit
        traceback.print_exc()
        return 1


def _end_group() -> None:
    """Ends this arm's process group on every rank together, as the runtime does at a script's end, and drops
    what sprite's checkpoint saving made for that group (its gloo group, its writer), so the next arm's saves
    make their own."""
    from sprite.runtime import finish, world_check
    from sprite.runtime.ckpt import durable
    from sprite.runtime.ckpt import save as ckpt_save

    durable.drain()
    world_check.note()
    finish.finish()
    ckpt_save.forget()


def serve(folder: pathlib.Path, host_pid: int, rank: int) -> int:
    """Runs tasks until told to stop; returns 0, or a failed arm's exit code."""
    import torch

    from sprite.parity.pool import isolation

    base = isolation.capture()
    n = 0
    while (task := _next_task(folder, n, host_pid)) is not None:
        started = time.time()
        with _output_to(task["log"]):
            isolation.restore_rng(base)
            os.environ.update(task.get("env", {}))  # this arm's rendezvous port; reset() puts the pool's back
            if task.get("threads"):  # a one-process arm: the threads its own launch would get
                torch.set_num_threads(task["threads"])
                os.environ["OMP_NUM_THREADS"] = str(task["threads"])
            code = _run(task)
            if task.get("threads"):
                torch.set_num_threads(base.flags["threads"])
            if code == 0:
                _end_group()
            changed, leaks = isolation.reset(base)
            for line in changed + leaks:
                print(f"sprite parity: pool rank {rank}: after this arm: {line}", file=sys.stderr, flush=True)
        record = {"code": code, "changed": changed, "leaks": leaks, "start": started, "end": time.time()}
        tmp = folder / f".done_{n}.tmp"
        tmp.write_text(json.dumps(record))
        os.replace(tmp, folder / f"done_{n}.json")
        if code != 0 or leaks:
            return code or 3
        n += 1
    return 0


def main(argv: list[str] | None = None) -> int:
    from sprite.runtime import finish

    finish.skip_teardown()  # sprite's own worker: nothing to finalize once its atexit handlers ran (finish.py)
    parser = argparse.ArgumentParser(prog="sprite.parity.pool.worker")
    parser.add_argument("--dir", required=True, type=pathlib.Path)
    parser.add_argument("--host-pid", required=True, type=int)
    parser.add_argument("--host-name", default="")
    args = parser.parse_args(argv)
    if args.host_name and args.host_name != socket.gethostname():  # another node's pid means nothing here
        args.host_pid = 0
    rank = int(os.environ.get("RANK", "0"))
    return serve(args.dir / f"rank{rank}", args.host_pid, rank)


if __name__ == "__main__":
    sys.exit(main())
