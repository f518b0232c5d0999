"""Rendezvous: where rank 0 listens (MASTER_ADDR, MASTER_PORT), agreed by every node without talking.

sprite owns both: the address is the first host it launches on (never a host left out with --exclude; at a site
whose profile names a high-speed network, ``rendezvous_domain``, the host's name on it), and the port comes from,
in order, an explicit value (--master-port or the spec's master_port), a hash of the scheduler job id (so every
node and every rank computes the same number), or a free port of this machine for local runs.
Values inherited from the caller's environment are replaced, with a note saying so (``replaced``).
"""

from __future__ import annotations

import socket
import zlib
from typing import Callable, Mapping

from sprite.errors import one_line

# Derived ports stay inside [PORT_BASE, PORT_BASE + PORT_SPAN): above the registered well-known services most
# sites run, and below Linux's default ephemeral range (32768-60999), so a derived port never collides with an
# outgoing connection's source port.
PORT_BASE = 20000
PORT_SPAN = 10000


def port_from_job_id(job_id: str) -> int:
    """A port derived from ``job_id``: deterministic across hosts and Python runs (crc32, not ``hash``)."""
    return PORT_BASE + zlib.crc32(job_id.encode()) % PORT_SPAN


def free_port() -> int:
    """A TCP port that is free on this machine right now (for single-machine runs)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def master_addr(hosts: tuple[str, ...], domain: str | None = None) -> str:
    """The first host sprite launches on; with ``domain`` (a site's high-speed network, e.g.
    ``hsn.cm.aurora.alcf.anl.gov``) that host's short name in it, so the rendezvous runs over that network."""
    return f"{hosts[0].split('.')[0]}.{domain}" if domain else hosts[0]


def master_port(job_id: str, explicit: int | None, pick_free: Callable[[], int] = free_port) -> int:
    """The rendezvous port: ``explicit``, else derived from ``job_id``, else a free port."""
    if explicit:
        return explicit
    if job_id:
        return port_from_job_id(job_id)
    return pick_free()


def replaced(environ: Mapping[str, str], env: Mapping[str, str]) -> list[str]:
    """Notes for each MASTER_ADDR / MASTER_PORT of ``environ`` that the plan's ``env`` replaces."""
    return [f"note: {name}={one_line(environ[name], 80)} from the environment is replaced by {env[name]}; sprite "
            "plans the rendezvous for the hosts it launches (choose the port with --master-port)."
            for name in ("MASTER_ADDR", "MASTER_PORT") if environ.get(name) and environ[name] != env.get(name)]
