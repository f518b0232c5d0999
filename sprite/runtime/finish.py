"""End every rank of a launched fit together: wait for all ranks at the end of the script, destroy the process
group while every peer is still alive, and let rank 0, which hosts the rendezvous store, exit last.

A gloo rank that exits with its process group alive can abort at interpreter exit with "terminate called without
an active exception" (its worker threads are destroyed unjoined while module globals are cleared): pytorch#65231,
fixed in torch's own tests by an explicit destroy_process_group (pytorch#65513); reproduced here with plain torch
2.13, 5 gloo ranks doing one all_gather and exiting (benchmarks/finish_stress.py). Lightning never destroys the
group, so sprite does it once the script has returned. The waits go through the store, not a collective, so they
never pair with a collective a peer is still stuck in (a save reached by rank 0 alone): the finished ranks wait,
and the stall watchdog names the phase of the one that is stuck. Rank 0 leaves last because the store lives in
its process: a rank still polling it must not find it gone.

Then the interpreter's own teardown: for a rank that imported torch, Lightning, transformers and peft it
deallocates that whole heap, about 0.4 s a rank on 2 CPU cores (1.5 s for a fresh interpreter with those imports),
with nothing left to do once the atexit handlers ran. sprite's own harness workers (parity, ckpt-check, bench),
which keep nothing whose finalizer matters, ask to skip it (``skip_teardown``); a user's script never does, since
a buffered file held in a module global is flushed only by that teardown.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time

ARRIVED, RELEASED = "sprite/finish/arrived", "sprite/finish/released"
FAILED = "sprite/finish/failed"  # counted up by a failing rank (``abandon``): its peers stop waiting for it
WAIT_ALL_SECONDS = 1800.0  # as long as Lightning's default process-group timeout: a rank may still be saving
WAIT_RELEASE_SECONDS = 60.0


def _wait_count(store, key: str, target: int, seconds: float) -> str:
    """"" once ``key`` counts ``target``; "failed" as soon as a rank marked itself failing; "timeout"."""
    deadline = time.monotonic() + seconds
    while store.add(key, 0) < target:
        if store.add(FAILED, 0):
            return "failed"
        if time.monotonic() > deadline:
            return "timeout"
        time.sleep(0.05)
    return ""


def finish() -> None:
    """After the script returned on this rank: barrier (through the store), destroy the process group, and keep
    rank 0 alive until every other rank has torn its own down. Does nothing outside a process group."""
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        return
    rank, world = dist.get_rank(), dist.get_world_size()
    if world == 1:
        dist.destroy_process_group()
        return
    store = dist.distributed_c10d._get_default_store()  # held here, so it outlives the process group
    store.add(ARRIVED, 1)
    missing = _wait_count(store, ARRIVED, world, WAIT_ALL_SECONDS)
    if missing == "failed":  # that rank's own error is the run's outcome; this one finished
        print(f"sprite: rank {rank}: another rank failed before the end of the script; exiting without waiting "
              "for it.", file=sys.stderr, flush=True)
        _leave_group(failing=False)
        return
    if missing:
        print(f"sprite: warning: rank {rank}: not every rank reached the end of the script within "
              f"{WAIT_ALL_SECONDS:.0f} s; exiting without waiting for them.", file=sys.stderr, flush=True)
        return
    dist.destroy_process_group()
    if rank != 0:
        store.add(RELEASED, 1)
    elif _wait_count(store, RELEASED, world - 1, WAIT_RELEASE_SECONDS):
        print("sprite: warning: rank 0: some ranks did not confirm their shutdown; exiting anyway.",
              file=sys.stderr, flush=True)


def abandon(seconds: float = 10.0) -> None:
    """On a rank that is failing (an exception or a non-zero exit from the script): count it in the store's
    FAILED key, so peers that finished and wait for it in ``finish`` leave at once (mpiexec, unlike srun's
    --kill-on-bad-exit, lets them wait: a rank that raised after its fit held its peers for WAIT_ALL_SECONDS),
    and leave the process group without waiting for any peer (``_leave_group``). Never raises."""
    _leave_group(seconds, failing=True)


def _leave_group(seconds: float = 10.0, failing: bool = True) -> None:
    """Mark this rank failing in the store (``failing``), and destroy a gloo process group without waiting for any
    peer, so the interpreter's exit cannot abort in gloo's threads and turn the rank's own exit code (2 for a
    --strict check, 1 for a crash) into -6. Peers may be stuck, so nothing waits for them, and both get
    ``seconds`` in a daemon thread. Other backends' groups are left alone (an NCCL destroy with work in flight can
    hang). Never raises."""
    try:
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return
        gloo = "gloo" in str(dist.get_backend()).lower()
    except Exception:  # a failing rank must still exit with its own code
        return
    if not (gloo or failing):
        return
    done = threading.Event()

    def leave() -> None:
        try:
            if failing:
                dist.distributed_c10d._get_default_store().add(FAILED, 1)
        except Exception:  # the store's host may be gone: nothing is waiting there then
            pass
        try:
            if gloo:
                dist.destroy_process_group()
        except Exception:
            pass
        finally:
            done.set()

    threading.Thread(target=leave, name="sprite-abandon", daemon=True).start()
    done.wait(seconds)


_skip_teardown = False


def skip_teardown() -> None:
    """For sprite's own harness workers only: after a clean end (exit 0) this rank leaves as soon as its atexit
    handlers ran and its standard streams are flushed, skipping the interpreter's teardown (``leave``)."""
    global _skip_teardown
    _skip_teardown = True


def leave() -> None:
    """At the end of a rank whose script ended with exit 0: if the script asked (``skip_teardown``), run the
    atexit handlers, flush stdout and stderr and end the process with ``os._exit(0)``, as multiprocessing's forked
    children end. Returns, and the interpreter exits the usual way, when the script did not ask, when another
    non-daemon thread or a multiprocessing child is still alive (the usual exit waits for them), or when this
    Python has no ``atexit._run_exitfuncs`` (a private CPython name, checked on 3.11 and 3.12 by
    tests/test_runtime_leave.py; without it no handler may be skipped, so nothing is)."""
    run_handlers = getattr(atexit, "_run_exitfuncs", None)
    if not _skip_teardown or run_handlers is None:
        return
    main = threading.main_thread()
    if any(thread is not main and not thread.daemon for thread in threading.enumerate()):
        return
    processes = sys.modules.get("multiprocessing")
    if processes is not None and processes.active_children():
        return
    run_handlers()
    for stream in (sys.stdout, sys.stderr):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):  # a closed or broken stream: nothing more can reach it
            pass
    os._exit(0)
