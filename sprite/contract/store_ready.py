"""A rank other than 0 waits until rank 0's rendezvous store listens before torch connects to it.

torch's ``TCPStore`` client that finds nothing listening at MASTER_ADDR:MASTER_PORT retries only after a backoff:
a rank that reaches ``init_process_group`` a few milliseconds before rank 0 has opened its store waits about half a
second, and rank 0 waits for it (torch 2.13, measured by benchmarks/store_connect.py; forked ranks, as a warm server
starts them, can meet it at every launch). :func:`wait` polls the port instead, every 10 ms, with plain TCP connections
that send nothing and close at once (torch's store drops them), so the client torch then makes connects on its first
try. It gives up quietly at the deadline: torch's own connect then fails as it would have.
"""

from __future__ import annotations

import os
import socket
import time

POLL_SECONDS = 0.01
DEFAULT_SECONDS = 1800.0  # torch's default process-group timeout


def needed(args: tuple, kwargs: dict, environ=os.environ) -> tuple[str, int] | None:
    """(host, port) of the store an ``init_process_group(*args, **kwargs)`` call will connect to as a client, when
    this rank is not rank 0 and the call uses the env:// rendezvous; else None (nothing to wait for)."""
    def given(name: str, at: int, default=None):  # positions: backend, init_method, timeout, world_size, rank, store
        return kwargs.get(name, args[at] if len(args) > at else default)

    init_method = given("init_method", 1)
    if given("store", 5) is not None or init_method not in (None, "env://"):
        return None
    if environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":  # torchrun's agent holds a store that listens already
        return None
    rank, world = given("rank", 4), given("world_size", 3)
    rank = environ.get("RANK", "0") if rank in (None, -1) else rank
    world = environ.get("WORLD_SIZE", "1") if world in (None, -1) else world
    host, port = environ.get("MASTER_ADDR"), environ.get("MASTER_PORT")
    try:
        if int(rank) == 0 or int(world) < 2 or not host or not port:
            return None
        return host, int(port)
    except ValueError:
        return None  # torch reports a malformed RANK, WORLD_SIZE or MASTER_PORT itself


def wait(host: str, port: int, seconds: float = DEFAULT_SECONDS) -> bool:
    """Poll until ``host:port`` accepts a TCP connection (then True) or ``seconds`` pass (False)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            socket.create_connection((host, port), timeout=max(0.1, min(5.0, deadline - time.monotonic()))).close()
            return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(POLL_SECONDS)


def before_init(args: tuple, kwargs: dict) -> None:
    """What sprite's ``init_process_group`` wrapper runs first (sprite.runtime.world_check.install)."""
    target = needed(args, kwargs)
    if target is not None:
        timeout = kwargs.get("timeout", args[2] if len(args) > 2 else None)
        wait(*target, timeout.total_seconds() if timeout is not None else DEFAULT_SECONDS)
