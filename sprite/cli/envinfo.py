"""`sprite env`: what sprite sees from here, without importing torch (so it answers at once on a login node)."""

from __future__ import annotations

import json
import os
import shutil
import socket
from pathlib import Path
from typing import Mapping

from sprite import contract, schedulers
from sprite.launch import devicecount
from sprite.spec import secrets as secret_env
from sprite.spec import sites
from sprite.launch import world


def count_devices(environ: Mapping[str, str] = os.environ, sysfs: str | Path = "/sys") -> tuple[str, int]:
    """(device type, count) torch would see from here (``sprite.launch.devicecount``), else ("cpu", CPU cores)."""
    kind, count = devicecount.visible(environ, sysfs)
    return (kind, count) if count else ("cpu", os.cpu_count() or 1)


def detect(site_name: str | None = None, environ: Mapping[str, str] = os.environ, sysfs: str | Path = "/sys") -> dict:
    """A summary of scheduler, hosts, ranks per node, devices, backend, the site's rank environment (secrets
    masked) and the names of this environment's variables the site's patterns make secrets (values never shown).
    Raises UsageError for a bad site."""
    alloc = schedulers.discover(environ, hostname=socket.gethostname())
    from sprite.launch.plan import check_site_scheduler
    from sprite.spec import job as specmod

    # checked as sprite run checks --site: an empty one (--site "$SITE", SITE unset) is refused, not taken for local
    flags = specmod.from_flags({"site": site_name})
    site = sites.choose(flags, {}, None, environ)  # names the flag or variable
    check_site_scheduler(site, alloc)  # sprite run refuses it here: so does the summary of what it would do
    device, count = count_devices(environ, sysfs)
    accelerator = site.job.get("accelerator", "auto")
    site_env = site.job.get("env", {})

    def is_secret(name: str) -> bool:
        return secret_env.is_secret(name, site.job.get("secrets", ()), site.secret_patterns)

    kind = device if accelerator == "auto" else accelerator
    here = devicecount.default_ranks(accelerator, environ, sysfs) if alloc.scheduler == "none" else None
    return {
        "scheduler": alloc.scheduler,
        "job_id": alloc.job_id,
        "hosts": list(alloc.hosts),
        "nodes": len(alloc.hosts),
        "site": site.name,
        "ranks_per_node": world.ranks_per_node(None, site, alloc.tasks_per_node, here),
        "launcher": site.job.get("launcher", "auto"),
        "mpi": site.mpi,
        "devices_here": {"type": device, "count": count},
        "accelerator": kind,
        "backend": contract.BACKENDS.get(kind, "gloo"),
        "mpiexec": shutil.which("mpiexec"),
        "srun": shutil.which("srun"),
        "env": secret_env.mask(site_env, [n for n in site_env if is_secret(n)]),
        "secrets_here": sorted(n for n in environ if is_secret(n)),
        "notes": schedulers.detection_notes(environ),  # e.g. which batch system won when several are set
    }


def to_json(info: dict) -> str:
    return json.dumps(info, indent=2)


def describe(info: dict) -> str:
    hosts = ", ".join(info["hosts"][:4]) + (" ..." if info["nodes"] > 4 else "")
    rows = [
        ("scheduler", info["scheduler"] + (f" (job {info['job_id']})" if info["job_id"] else "")),
        ("hosts", f"{info['nodes']}: {hosts}"),
        ("site", info["site"]),
        ("ranks/node", str(info["ranks_per_node"])),
        ("devices here", f"{info['devices_here']['count']} x {info['devices_here']['type']}"),
        ("accelerator", f"{info['accelerator']} (backend {info['backend']})"),
        ("mpiexec", info["mpiexec"] or "not found"),
        ("srun", info["srun"] or "not found"),
        ("site env", " ".join(f"{k}={v}" for k, v in info["env"].items()) or "none"),
        ("secret vars", ", ".join(info["secrets_here"]) or "none"),
    ]
    rows += [("note", note[len("note: "):]) for note in info["notes"]]
    return "\n".join(f"{name:<13}{value}" for name, value in rows)
