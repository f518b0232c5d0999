"""How long a rank other than 0 takes to join the rendezvous store when it gets there first.

sprite.contract.store_ready makes such a rank wait for the store's port before torch connects.

A client thread calls ``TCPStore(..., is_master=False)`` ``--lead`` seconds before the master thread opens the store
(as a forked rank 1 often does before rank 0); timed from the client's call until both have returned. Baseline: torch
alone (its client retries after a backoff); against it: sprite's ``store_ready.wait`` first. Medians of --repeats,
the two interleaved.

    python benchmarks/store_connect.py [--lead 0.05] [--repeats 5]
"""

from __future__ import annotations

import argparse
import socket
import statistics
import threading
import time
from datetime import timedelta


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def once(lead: float, poll_first: bool) -> float:
    from torch.distributed import TCPStore

    from sprite.contract import store_ready

    port, done = _free_port(), {}
    start = time.perf_counter()

    def client():
        if poll_first:
            store_ready.wait("127.0.0.1", port, 30)
        store = TCPStore("127.0.0.1", port, 2, False, timedelta(seconds=30))
        store.set("joined", "1")
        done["client"] = time.perf_counter()

    thread = threading.Thread(target=client)
    thread.start()
    time.sleep(lead)
    master = TCPStore("127.0.0.1", port, 2, True, timedelta(seconds=30))
    master.get("joined")
    thread.join()
    return max(done["client"], time.perf_counter()) - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lead", type=float, default=0.05, help="seconds the client starts before the master")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch_alone, polled = [], []
    for _ in range(args.repeats):
        torch_alone.append(once(args.lead, False))
        polled.append(once(args.lead, True))
    alone, first = statistics.median(torch_alone), statistics.median(polled)
    print(f"client {args.lead:.3f} s ahead of the master: torch alone {alone:.3f} s, with store_ready.wait first"
          f" {first:.3f} s (ratio {first / alone:.2f}; medians of {args.repeats})")


if __name__ == "__main__":
    main()
