"""Rendezvous: where rank 0 listens (MASTER_ADDR, MASTER_PORT), agreed by every node without talking.

sprite owns both: the address is the first host it launches on (never a host left out with --exclude; at a site
whose profile names a high-speed network, ``rendezvous_domain``, the host's name on it), and the port comes from,
in order, an explicit value (--master-port or the spec's master_port), a hash of the scheduler job id (so every
node and every rank computes the same number), or a free port of this machine for local runs, drawn from the
same span outside the kernel's ephemeral range (``free_port``).
Values inherited from the caller's environment are replaced, with a note saying so (``replaced``).
"""

from __future__ import annotations

import errno
import random
import socket
import zlib
from pathlib import Path
from typing import Callable, Mapping

from sprite.errors import UsageError, one_line

# Derived ports stay inside [PORT_BASE, PORT_BASE + PORT_SPAN): above the registered well-known services most
# sites run, and below Linux's default ephemeral range (32768-60999), so a derived port never collides with an
# outgoing connection's source port.
PORT_BASE = 20000
PORT_SPAN = 10000
FREE_PORT_DRAWS = 32
EPHEMERAL_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
EPHEMERAL_DEFAULT = (32768, 60999)


def port_from_job_id(job_id: str) -> int:
    """A port derived from ``job_id``: deterministic across hosts and Python runs (crc32, not ``hash``)."""
    return PORT_BASE + zlib.crc32(job_id.encode()) % PORT_SPAN


def ephemeral_range(path: str = EPHEMERAL_FILE) -> tuple[int, int]:
    """The ports this machine's kernel hands out itself (to ``bind(0)`` and outgoing connections), inclusive;
    Linux's default when ``path`` cannot be read."""
    try:
        low, high = (int(field) for field in Path(path).read_text().split())
    except (OSError, ValueError):
        return EPHEMERAL_DEFAULT
    return low, high


def free_port(draw: Callable[[range, int], list[int]] = random.SystemRandom().sample,
              kernel: tuple[int, int] | None = None) -> int:
    """A TCP port free on this machine now (for single-machine runs), drawn from [PORT_BASE, PORT_BASE +
    PORT_SPAN) outside ``kernel`` (the ephemeral range). A port the kernel handed out once can be handed to
    another process (its outgoing connection, a gloo listener) before rank 0 listens on it, seconds later:
    a relaunched attempt failed so with EADDRINUSE in a loaded test run. Where the whole span lies inside the
    ephemeral range, or every drawn port is taken, the kernel chooses."""
    low, high = kernel or ephemeral_range()
    for port in draw(range(PORT_BASE, PORT_BASE + PORT_SPAN), FREE_PORT_DRAWS):
        if not low <= port <= high and not taken(port):
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def master_addr(hosts: tuple[str, ...], domain: str | None = None) -> str:
    """The first host sprite launches on; with ``domain`` (a site's high-speed network, e.g.
    ``hsn.cm.aurora.alcf.anl.gov``) that host's short name in it, so the rendezvous runs over that network."""
    return f"{hosts[0].split('.')[0]}.{domain}" if domain else hosts[0]


def master_port(job_id: str, explicit: int | None, pick_free: Callable[[], int] = free_port,
                attempt: str = "") -> int:
    """The rendezvous port: ``explicit``, else derived from ``job_id`` (and, from the second attempt of a run on,
    its number: a process of the attempt before may still hold that attempt's port, as one did in a loaded CI run
    under srun, EADDRINUSE), else a free port."""
    if explicit:
        return explicit
    if job_id:
        return port_from_job_id(job_id if attempt in ("", "1") else f"{job_id}/attempt-{attempt}")
    return pick_free()


def hosted_here(addr: str, hostname: str) -> bool:
    """Whether rank 0, which listens at ``addr``, runs on this machine (named ``hostname``)."""
    return addr in ("127.0.0.1", "localhost") or addr.split(".")[0] == hostname.split(".")[0]


def taken(port: int) -> bool:
    """Whether something on this machine listens on ``port`` already. SO_REUSEADDR as torch's TCPStore sets
    it, so a socket an earlier attempt left in TIME_WAIT does not count: only a live listener does."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("", port))
        except OSError as err:
            return err.errno == errno.EADDRINUSE
    return False


def check_free(env: Mapping[str, str], hostname: str = "") -> None:
    """Before a launch: raise UsageError when rank 0 would listen on this machine and its port is taken.

    Without this, rank 0 fails with EADDRINUSE while the other ranks may join the listener's store (another
    job's) and wait there. Two jobs on one node get the same derived port when their ids' hashes agree
    modulo PORT_SPAN. Rank 0 on another host cannot be checked from here; a world of one rank listens nowhere.
    """
    addr, port = env.get("MASTER_ADDR", ""), env.get("MASTER_PORT", "")
    if env.get("WORLD_SIZE", "1") == "1" or not port.isdigit() or not hosted_here(addr, hostname or socket.gethostname()) or not taken(int(port)):
        return
    raise UsageError(f"The rendezvous port {port} on {addr} is already in use, so rank 0 could not listen there.",
                     "Another job on this node uses it (the port derived from two job ids can be the same), or "
                     "a process of an earlier run still holds it.",
                     "Pass --master-port with a free port (or set master_port: in the spec).")


def replaced(environ: Mapping[str, str], env: Mapping[str, str]) -> list[str]:
    """Notes for each MASTER_ADDR / MASTER_PORT of ``environ`` that the plan's ``env`` replaces."""
    return [f"note: {name}={one_line(environ[name], 80)} from the environment is replaced by {env[name]}; sprite "
            "plans the rendezvous for the hosts it launches (choose the port with --master-port)."
            for name in ("MASTER_ADDR", "MASTER_PORT") if environ.get(name) and environ[name] != env.get(name)]
