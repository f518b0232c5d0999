"""`sprite env`: what sprite sees from here, without importing torch (so it answers at once on a login node)."""

from __future__ import annotations

import glob
import json
import os
import shutil
import socket
import subprocess
from pathlib import Path
from typing import Mapping

from sprite import allocation, contract, schedulers, secret_env, sites, world


def count_devices() -> tuple[str, int]:
    """(device type, count) visible from here: NVIDIA GPUs via nvidia-smi, Intel GPUs via /dev/dri, else CPUs."""
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10).stdout
            gpus = [line for line in out.splitlines() if line.startswith("GPU ")]
            if gpus:
                return "cuda", len(gpus)
        except (OSError, subprocess.TimeoutExpired):
            pass
    intel = [p for p in glob.glob("/sys/class/drm/renderD*/device/vendor") if Path(p).read_text().strip() == "0x8086"]
    if intel and os.environ.get("ZE_FLAT_DEVICE_HIERARCHY", "FLAT") == "FLAT":
        return "xpu", len(intel)
    return "cpu", os.cpu_count() or 1


def detect(site_name: str | None = None, environ: Mapping[str, str] = os.environ) -> dict:
    """A summary of scheduler, hosts, ranks per node, devices, backend, the site's rank environment (secrets
    masked) and the names of this environment's variables the site's patterns make secrets (values never shown).
    Raises UsageError for a bad site."""
    alloc = allocation.discover(environ, hostname=socket.gethostname())
    site = sites.load(site_name or environ.get("SPRITE_SITE") or "local")
    device, count = count_devices()
    accelerator = site.job.get("accelerator", "auto")
    site_env = site.job.get("env", {})

    def is_secret(name: str) -> bool:
        return secret_env.is_secret(name, site.job.get("secrets", ()), site.secret_patterns)

    kind = device if accelerator == "auto" else accelerator
    return {
        "scheduler": alloc.scheduler,
        "job_id": alloc.job_id,
        "hosts": list(alloc.hosts),
        "nodes": len(alloc.hosts),
        "site": site.name,
        "ranks_per_node": world.ranks_per_node(None, site, alloc.tasks_per_node),
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
