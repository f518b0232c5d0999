"""sprite's local launcher: start N ranks on this machine, label their output, and never leave one behind.

    python -m sprite.launch.supervisor --nproc 2 [--log-dir DIR] [--ranks 0] -- python -m sprite.runtime train.py

Each rank gets RANK, LOCAL_RANK, LOCAL_WORLD_SIZE, NODE_RANK (WORLD_SIZE and the rendezvous from the plan's
environment); output lines are prefixed ``[rank N]``; only the ranks ``--ranks`` names reach the console, and with
``--log-dir`` every rank's lines go to ``DIR/rank<N>.log`` (a new file). When a rank fails, the others are stopped
(SIGTERM, SIGKILL after a grace period) and the supervisor exits with its code; exit 75 (stopped for preemption) is
no failure: the others get PREEMPT_WAIT s to do the same. SIGINT/SIGTERM stop every rank; SIGUSR1/SIGUSR2 are
passed on. On CPU the ranks are forked from this process once it has imported torch and Lightning, which they
then do not import again (sprite.launch.warmstart; SPRITE_FORK_RANKS=0 starts fresh interpreters); with a warm
server's socket in SPRITE_WARM_SERVER they are the server's forks instead, and this process imports neither
(sprite.launch.warmserver).
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from sprite.integrity import owner_only
from sprite.contract import console as console_grammar
from sprite.errors import EXIT_PREEMPTED
from sprite.launch import warmstart
from sprite.launch.procgroup import die_with_parent, pump, stop_groups as stop_all

PREEMPT_WAIT = 60.0  # seconds the others get after one rank stopped for preemption (they leave together)
PASSED_ON = (signal.SIGUSR1, signal.SIGUSR2)


def rank_env(rank: int, nproc: int) -> dict:
    """Rank ``rank``'s environment: this process's, with the rank variables."""
    env = {**os.environ, "RANK": str(rank), "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(nproc),
           "NODE_RANK": "0", "GROUP_RANK": "0", "PYTHONUNBUFFERED": "1"}
    env.setdefault("WORLD_SIZE", str(nproc))
    # N ranks each using every core oversubscribe the CPU (torchrun sets 1 for the same reason); give each
    # rank its share unless the user chose a value.
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    return env


def start_rank(rank: int, nproc: int, cmd: list[str], warm: bool = False):
    """Start one rank with its own process group: a fresh interpreter, or with ``warm`` a fork of this process
    (sprite.launch.warmstart). Returns the process, or in a forked child the warmstart.Rank it is to run."""
    env = rank_env(rank, nproc)
    if warm:
        return warmstart.fork(env, cmd)
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True, preexec_fn=die_with_parent)


def attach(rank: int, proc, log_dir: Path | None, lock: threading.Lock, console: bool = True) -> tuple:
    """Copy a started rank's output (prefixed ``[rank N]``) to the console and its log; returns (process, pump
    threads, log file). Raises FileExistsError when ``log_dir`` already holds this rank's log (logs are never
    appended to)."""
    log = owner_only.open_log(log_dir / f"rank{rank}.log") if log_dir else None
    prefix = f"[rank {rank}] ".encode()
    sinks = (sys.stdout.buffer, sys.stderr.buffer) if console else (None, None)
    pumps = [threading.Thread(target=pump, args=(s, sink, log, lock, prefix), daemon=True)
             for s, sink in zip((proc.stdout, proc.stderr), sinks)]
    for thread in pumps:
        thread.start()
    return proc, pumps, log


def forward(procs: list[subprocess.Popen], sig: int) -> None:
    """Send ``sig`` to every live rank process (not its group: a data loader worker has no handler for it)."""
    print(f"sprite: passing {signal.Signals(sig).name} on to every rank.", file=sys.stderr, flush=True)
    for proc in procs:
        if proc.poll() is None:
            try:
                os.kill(proc.pid, sig)
            except ProcessLookupError:
                pass


def supervise(procs: list[subprocess.Popen], received: list[int]) -> int:
    """Wait until every rank exits 0 (return 0) or 75 (return 75), one fails, or SIGINT/SIGTERM arrives; return
    the exit code. SIGUSR1/SIGUSR2 (a scheduler's warning before preemption) are passed on to every rank."""
    preempted_at = None
    while True:
        while received and received[0] in PASSED_ON:
            forward(procs, received.pop(0))
        if received:
            stop_all(procs, received[0])
            return 128 + received[0]
        codes = [proc.poll() for proc in procs]
        failed = [(rank, code) for rank, code in enumerate(codes) if code not in (None, 0, EXIT_PREEMPTED)]
        if failed:
            rank, code = failed[0]
            print(f"sprite: rank {rank} exited with code {code}; stopping the other ranks.", file=sys.stderr)
            stop_all(procs)
            return code if code > 0 else 128 - code
        if None not in codes:
            return EXIT_PREEMPTED if EXIT_PREEMPTED in codes else 0
        if EXIT_PREEMPTED in codes:
            preempted_at = preempted_at or time.monotonic()
            if time.monotonic() - preempted_at > PREEMPT_WAIT:
                print(f"sprite: ranks ran on {PREEMPT_WAIT:.0f} s after one stopped for preemption.", file=sys.stderr)
                stop_all(procs)
                return EXIT_PREEMPTED
        time.sleep(0.1)


def main(argv: list[str] | None = None, may_fork: bool = False):
    """Start and supervise the ranks; returns the exit code. With ``may_fork`` (run as a program, never when
    called in a process of someone else's) the ranks may be forked from this process: in such a child it returns
    the warmstart.Rank to run instead."""
    parser = argparse.ArgumentParser(prog="python -m sprite.launch.supervisor", description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, required=True, help="ranks to start on this machine")
    parser.add_argument("--log-dir", type=Path, help="also write rank N's output to DIR/rankN.log (0600, in 0700 "
                        "folders when sprite creates them)")
    parser.add_argument("--ranks", default="all", help="ranks whose lines reach the console: all, 0 or a list")
    parser.add_argument("cmd", nargs=argparse.REMAINDER, help="-- then the command every rank runs")
    args = parser.parse_args(argv)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if args.nproc < 1 or not cmd:
        parser.error("need --nproc >= 1 and a command after --")
    if args.log_dir:
        owner_only.make_dirs(args.log_dir)
        if any((args.log_dir / f"rank{rank}.log").exists() for rank in range(args.nproc)):
            parser.error(f"{args.log_dir} already holds rank logs; pass a fresh --log-dir")
    received: list[int] = []
    for sig in (signal.SIGINT, signal.SIGTERM, *PASSED_ON):
        signal.signal(sig, lambda signum, frame: received.append(signum))
    if not shutil.which(cmd[0]):
        parser.error(f"cannot run {cmd[0]!r}: no such program on PATH")
    lock = threading.Lock()
    shown = set(console_grammar.members(args.ranks, args.nproc))
    # No thread may run before the last fork: every rank starts before any output is copied.
    # With a warm server (sprite.launch.warmserver) the ranks are its forks and this process imports nothing.
    warm = (may_fork and warmstart.wanted(cmd) and not warmstart.server_waiting()
            and warmstart.warm_up(rank_env(0, args.nproc)["OMP_NUM_THREADS"]))
    procs = []
    for rank in range(args.nproc):
        proc = start_rank(rank, args.nproc, cmd, warm)
        if isinstance(proc, warmstart.Rank):
            return proc
        procs.append(proc)
    started = [attach(rank, proc, args.log_dir, lock, rank in shown) for rank, proc in enumerate(procs)]
    code = supervise([proc for proc, _, _ in started], received)
    for _, pumps, log in started:
        for thread in pumps:
            thread.join(timeout=2)
        if log:
            log.close()
    return code


if __name__ == "__main__":
    outcome = main(may_fork=True)
    if isinstance(outcome, warmstart.Rank):  # a forked rank, out of the supervisor's frames
        warmstart.run(outcome)
    else:
        sys.exit(outcome)
