"""sprite.contract.store_ready: a rank other than 0 waits for rank 0's store to listen before torch connects."""

from __future__ import annotations

import socket
import threading
import time
from datetime import timedelta

import pytest

from sprite.contract import store_ready

ENV = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}


@pytest.mark.parametrize("args, kwargs, environ, expected", [
    ((), {}, ENV, ("127.0.0.1", 29500)),
    (("gloo",), {"rank": 1, "world_size": 2}, {**ENV, "RANK": "0"}, ("127.0.0.1", 29500)),  # Lightning passes rank
    (("gloo", None, timedelta(seconds=5), 2, 1), {}, {**ENV, "RANK": "0"}, ("127.0.0.1", 29500)),  # positional
    (("gloo", "env://"), {}, ENV, ("127.0.0.1", 29500)),
    ((), {}, {**ENV, "RANK": "0"}, None),  # rank 0 opens the store itself
    ((), {}, {**ENV, "WORLD_SIZE": "1"}, None),
    (("gloo", "tcp://127.0.0.1:29500"), {}, ENV, None),  # another rendezvous: torch's own
    ((), {"store": object()}, ENV, None),
    ((), {}, {**ENV, "TORCHELASTIC_USE_AGENT_STORE": "True"}, None),  # torchrun's agent store listens already
    ((), {}, {k: v for k, v in ENV.items() if k != "MASTER_PORT"}, None),
    ((), {}, {**ENV, "MASTER_PORT": "not-a-port"}, None),  # torch reports it
])
def test_only_a_client_of_an_env_rendezvous_store_waits(args, kwargs, environ, expected):
    assert store_ready.needed(args, kwargs, environ) == expected


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _listen_later(port: int, after: float) -> tuple[threading.Thread, list]:
    opened: list = []

    def run():
        time.sleep(after)
        server = socket.create_server(("127.0.0.1", port))
        opened.append(time.monotonic())
        time.sleep(1.0)
        server.close()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, opened


def test_the_wait_ends_once_the_port_listens_and_gives_up_at_its_deadline():
    port = _free_port()
    assert store_ready.wait("127.0.0.1", port, 0.2) is False
    thread, opened = _listen_later(port, 0.3)
    assert store_ready.wait("127.0.0.1", port, 10) is True
    assert opened  # it returned only after the listener was there
    thread.join()


def test_sprites_init_process_group_lets_torch_connect_only_once_rank_0s_store_listens(monkeypatch):
    import torch.distributed as dist

    from sprite.runtime import world_check

    port = _free_port()
    calls = []

    def fake_init(*args, **kwargs):  # torch's, as far as the wrapper can tell
        calls.append(time.monotonic())

    monkeypatch.setattr(dist, "init_process_group", fake_init)
    monkeypatch.setattr(world_check, "note", lambda: None)
    world_check.install(rank=1)
    for name, value in {**ENV, "MASTER_PORT": str(port)}.items():
        monkeypatch.setenv(name, value)
    thread, opened = _listen_later(port, 0.3)
    dist.init_process_group("gloo", timeout=timedelta(seconds=10))
    assert calls and opened and calls[0] >= opened[0]
    thread.join()


def test_a_poll_sends_nothing_and_closes_at_once():
    """What rank 0's store sees of a poll: a connection that closes without a byte (torch's store drops it)."""
    server = socket.create_server(("127.0.0.1", 0))
    port, got = server.getsockname()[1], []

    def accept():
        conn, _ = server.accept()
        conn.settimeout(5)
        got.append(conn.recv(64))  # b"" once the poll has closed its end
        conn.close()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    assert store_ready.wait("127.0.0.1", port, 5) is True
    thread.join(10)
    server.close()
    assert got == [b""]
