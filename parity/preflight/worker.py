"""One rank of `sprite preflight`, started as ``python -m sprite.runtime worker.py --out DIR`` on every node.

In order, each step recorded before the next one can hang: (1) the devices torch sees, the reference computation
and its time, written as ``ranks/rank<r>.compute.json``; (2) an all-reduce among the ranks of this node, then one
over all ranks, each timed and bounded by the collective timeout, written as ``ranks/rank<r>.json``; (3) the
computation timed once more (every rank has started by then), written as ``ranks/rank<r>.again.json``. A rank that
hangs therefore leaves its compute record and no final one, and its peers record a timed-out all-reduce; a rank
stopped in its second timed window (a slow node, once the other ranks' records are in) has finished its
all-reduces and is judged on its first window alone. Every
record names the host by the plan's host list (SPRITE_HOSTS[NODE_RANK]): simulated nodes share one hostname.
The rank then leaves with ``os._exit`` so that no teardown (gloo's threads, the runtime's end-of-fit barrier)
can wait on a peer that hangs.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist

from sprite import contract
from sprite.errors import one_line
from sprite.integrity import write_new
from sprite.parity.preflight import reference
from sprite.parity.preflight.settings import RECORD_SUFFIXES, PreflightSettings
from sprite.runtime.devices import device_type

DONE_KEY = "sprite/preflight/done"
HANG_SECONDS = 24 * 3600.0


def _write(out: pathlib.Path, name: str, record: dict) -> None:
    write_new(out / "ranks" / name, json.dumps(record, indent=1, sort_keys=True).encode())


def _identity() -> dict:
    hosts = [h for h in os.environ.get(contract.HOSTS, "").split(",") if h]
    node = int(os.environ.get("NODE_RANK", "0"))
    return {"rank": int(os.environ.get("RANK", "0")), "local_rank": int(os.environ.get("LOCAL_RANK", "0")),
            "world": int(os.environ.get("WORLD_SIZE", "1")), "node": node,
            "local_world": int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
            "host": hosts[node] if node < len(hosts) else socket.gethostname(), "hostname": socket.gethostname()}


def _device(kind) -> torch.device:
    if kind.name == "cpu" or not kind.is_available():
        return torch.device("cpu")
    return torch.device(kind.name, kind.module().current_device())  # the runtime bound it by local rank


def compute(settings: PreflightSettings, kind, fault: str | None) -> dict:
    """This rank's devices and reference computation (never raises: an error is recorded)."""
    seen = kind.device_count() - (1 if fault == "no-device" else 0)
    record = {"devices_seen": seen, "torch": torch.__version__, "python": platform.python_version(),
              "accelerator": kind.name, "threads": torch.get_num_threads(),
              "torch_from": os.path.dirname(torch.__file__)}  # a staged copy's, under sprite run --stage
    try:
        device = _device(kind)
        record["device_name"] = kind.device_name(device)
        record.update(reference.measure(device, kind, settings.precisions, settings.size, settings.repeats, fault))
    except Exception as err:  # a broken device must still take part in the collectives below
        record["error"] = one_line(f"{type(err).__name__}: {err}", 400)
    return record


def allreduce(group, ranks: int, kind, device: torch.device, mib: float) -> dict:
    """All-reduce of ``mib`` MiB of fp32 among ``ranks`` ranks: a checked warm-up, then three timed ones.
    Returns seconds (median), bus bandwidth in GB/s (nccl-tests' definition) or the error."""
    numel = max(1, int(mib * 2**20 / 4))
    start = time.perf_counter()
    try:
        tensor = torch.ones(numel, device=device)
        dist.all_reduce(tensor, group=group)
        if not bool(torch.all(tensor == ranks)):
            return {"ok": False, "ranks": ranks, "error": f"the sum of {ranks} ones is not {ranks} everywhere"}
        times = []
        for _ in range(3):
            kind.synchronize(device)
            begin = time.perf_counter()
            dist.all_reduce(tensor, group=group)
            kind.synchronize(device)
            times.append(time.perf_counter() - begin)
    except Exception as err:  # gloo: "Timed out waiting ...", nccl/xccl: the watchdog's error
        return {"ok": False, "ranks": ranks, "seconds": time.perf_counter() - start,
                "error": one_line(f"{type(err).__name__}: {err}", 300)}
    seconds = statistics.median(times)
    busbw = numel * 4 / seconds * 2 * (ranks - 1) / ranks / 1e9
    return {"ok": True, "ranks": ranks, "seconds": seconds, "busbw_gbps": busbw}


def rendezvous_timed_out(error: str, seconds: float, limit: float) -> bool:
    """Whether a failed rendezvous waited for peers that never came (the criterion then blames a silent peer, not
    this rank): it took most of its timeout, or torch says it timed out ("Timed out after 600 seconds waiting for
    clients", "The client socket has timed out"). A port taken or an address that does not resolve fails fast."""
    return seconds >= 0.9 * limit or "timed out" in error.lower()


# What a rank's rendezvous says when a peer (the store's host, say) died under it: its connection was closed or
# reset. torch 2.13 gloo, rank 0 killed in init_process_group: "DistNetworkError: Failed to recv, got 0 bytes.
# Connection was likely closed. Did the remote server shutdown or crash?"
PEER_LOST = ("got 0 bytes", "connection was likely closed", "reset by peer", "broken pipe", "closed by peer",
             "remote server shutdown or crash")


def rendezvous_peer_lost(error: str) -> bool:
    """Whether a failed rendezvous lost a peer that died (the criterion then blames the silent peer, not this
    rank)."""
    return any(words in error.lower() for words in PEER_LOST)


def collectives(ident: dict, settings: PreflightSettings, kind, fault: str | None) -> dict:
    """Rendezvous, then the node's all-reduce and the world's. The "hang" fault joins the rendezvous and then
    never enters an all-reduce. The rendezvous waits as long as the ranks' start-up may spread (the launch's
    deadline); each all-reduce runs in a group of its own made with the collective timeout."""
    timeout = datetime.timedelta(seconds=settings.collective_timeout)
    start = time.monotonic()
    try:
        dist.init_process_group(kind.backend, timeout=datetime.timedelta(seconds=settings.rendezvous_timeout))
    except Exception as err:
        error = one_line(f"{type(err).__name__}: {err}", 300)
        return {"rendezvous": {"ok": False, "error": error, "timed_out": rendezvous_timed_out(
            error, time.monotonic() - start, settings.rendezvous_timeout), "peer_lost": rendezvous_peer_lost(error)}}
    if fault == "hang":
        time.sleep(HANG_SECONDS)
    device = _device(kind)
    first = ident["node"] * ident["local_world"]
    members = list(range(first, first + ident["local_world"]))
    out = {"rendezvous": {"ok": True}}
    if len(members) > 1:
        try:
            group = dist.new_group(members, timeout=timeout, use_local_synchronization=True)
            out["node_allreduce"] = allreduce(group, len(members), kind, device, settings.allreduce_mib)
        except Exception as err:
            out["node_allreduce"] = {"ok": False, "error": one_line(f"{type(err).__name__}: {err}", 300)}
    else:
        out["node_allreduce"] = {"ok": True, "ranks": 1, "seconds": 0.0, "busbw_gbps": None}
    try:
        everyone = dist.new_group(list(range(ident["world"])), timeout=timeout)
        out["global_allreduce"] = allreduce(everyone, ident["world"], kind, device, settings.allreduce_mib)
    except Exception as err:
        out["global_allreduce"] = {"ok": False, "error": one_line(f"{type(err).__name__}: {err}", 300)}
    return out


def _leave(ident: dict, settings: PreflightSettings) -> None:
    """Rank 0 hosts the rendezvous store: it waits (bounded) until every rank has written its record."""
    try:
        # torch 2.13 has no public getter of the default group's store; the runtime's finish.py waits the same way.
        store = dist.distributed_c10d._get_default_store() if dist.is_initialized() else None
        if store is not None:
            store.add(DONE_KEY, 1)
            deadline = time.monotonic() + settings.collective_timeout
            while ident["rank"] == 0 and store.add(DONE_KEY, 0) < ident["world"] and time.monotonic() < deadline:
                time.sleep(0.05)
    except Exception:  # a peer is gone: nothing left to wait for
        pass
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="sprite preflight worker")
    parser.add_argument("--out", required=True, type=pathlib.Path)
    args = parser.parse_args(argv)
    settings = PreflightSettings.load(args.out)
    ident = _identity()
    fault = settings.fault_for(ident["host"]) if ident["local_rank"] == 0 else None
    kind = device_type(settings.accelerator)
    began = time.time()
    record = {**ident, **compute(settings, kind, fault), "started": began}
    _write(args.out, f"rank{ident['rank']}{RECORD_SUFFIXES['compute']}", record)
    final = {**ident, **collectives(ident, settings, kind, fault), "ended": time.time()}
    _write(args.out, f"rank{ident['rank']}{RECORD_SUFFIXES['final']}", final)
    if "seconds" in record:
        # A second timed window, now that every rank has started: the first one may have shared the cores with
        # the other ranks' start-up (simulated nodes on one machine); the slow check takes the faster window.
        # Written apart, after the final record: a slow rank stopped here did finish its all-reduces.
        again = reference.measure(_device(kind), kind, settings.precisions, settings.size, settings.repeats,
                                  fault)["seconds"]
        _write(args.out, f"rank{ident['rank']}{RECORD_SUFFIXES['again']}", {"seconds_again": again})
    _leave(ident, settings)


if __name__ == "__main__":
    main()
