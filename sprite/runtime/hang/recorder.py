"""What torch's flight recorder says of this rank's last collectives, as a small JSON-ready summary.

torch records every collective of a process group in a ring buffer when ``TORCH_FR_BUFFER_SIZE`` (older torch:
``TORCH_NCCL_TRACE_BUFFER_SIZE``) is above 0 before the group starts; sprite's plan sets it. The dump function is
private (listed in ``sprite/runtime/ckpt/torch_names.py`` with the versions it was checked against); without it,
or on a backend that records nothing (XCCL: torch-xpu-ops issue 5381), the summary says so instead.
"""

from __future__ import annotations

import json
import sys

RECORDER = ("torch._C._distributed_c10d", "_dump_fr_trace_json")  # checked on torch 2.13.0 CPU (gloo records)
NO_RECORDER = {"xccl": "no flight recorder on XCCL in this torch (torch-xpu-ops issue 5381)"}


def summary() -> dict:
    """``{"backend", "groups": [{"name", "ranks", "last_enqueued", "last_completed", "last": {...}}]}`` or
    ``{"backend", "none": why}``. Never raises: a failing dump, or a trace of a shape this code does not know, is
    reported as the reason there is none."""
    try:
        return _summary()
    except Exception as err:  # noqa: BLE001 (torch's private trace format may change: say so, never stop the rank)
        return {"backend": "", "none": f"the flight recorder could not be summarised ({type(err).__name__})"}


def _summary() -> dict:
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return {"backend": "", "none": "no process group was started"}
    backend = str(dist.get_backend())
    if backend in NO_RECORDER:
        return {"backend": backend, "none": NO_RECORDER[backend]}
    try:
        module = __import__(RECORDER[0], fromlist=[RECORDER[1]])
        trace = json.loads(getattr(module, RECORDER[1])(True, False))
    except Exception as err:  # noqa: BLE001 (any failure of a private torch function: say it, never stop the rank)
        return {"backend": backend, "none": f"the flight recorder could not be read ({type(err).__name__})"}
    try:
        groups = _groups(trace)
    except Exception as err:  # noqa: BLE001 (a trace of another shape than torch 2.13.0's)
        return {"backend": backend, "none": f"the flight recorder's trace has an unknown shape ({type(err).__name__})"}
    if not groups:
        return {"backend": backend, "none": f"the flight recorder recorded no collective on {backend} "
                                            "(TORCH_FR_BUFFER_SIZE unset or 0?)"}
    return {"backend": backend, "groups": groups}


def _groups(trace: dict) -> list[dict]:
    """One summary per process group: its last enqueued and completed sequence numbers and its last entry."""
    entries = trace.get("entries") or []
    configs = trace.get("pg_config") or {}
    out = []
    for pg_id, status in sorted((trace.get("pg_status") or {}).items()):
        mine = [e for e in entries if str(e.get("pg_id")) == pg_id and not e.get("is_p2p")]
        last = max(mine, key=lambda e: e.get("collective_seq_id", 0), default=None)
        group = (last or {}).get("process_group") or ["", ""]
        out.append({"pg": pg_id, "name": str(group[-1]), "ranks": str((configs.get(group[0]) or {}).get("ranks", "")),
                    "last_enqueued": _int(status.get("last_enqueued_collective")),
                    "last_completed": _int(status.get("last_completed_collective")),
                    "last": _entry(last) if last else None})
    return out


def _entry(entry: dict) -> dict:
    op = str(entry.get("profiling_name", "")).split(":")[-1]
    return {"op": op, "seq": entry.get("collective_seq_id"), "sizes": entry.get("input_sizes"),
            "dtypes": entry.get("input_dtypes"), "completed": bool(entry.get("retired"))}


def _int(value) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return -1
