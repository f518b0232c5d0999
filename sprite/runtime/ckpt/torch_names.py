"""The torch versions sprite's checkpointing is tested with, and the private torch names it still relies on.

sprite's save path uses public torch APIs only (``dcp.async_save``, ``FileSystemWriter``,
``torch.serialization.set_crc32_options``). What remains private is the reader's (``sprite.runtime.ckpt.dcp_read``)
and the shutdown's; each name below was checked against the torch versions in ``TESTED``, and
tests/test_torch_range.py fails, naming it, when the installed torch no longer has one. When torch moves one,
change it here and where the note says it is used.
"""

from __future__ import annotations

# The torch versions this module's names and sprite's checkpoint tests were run with (pyproject.toml states
# the same range as its torch requirement): 2.13.0 CPU (the development machines), 2.11.0+cu130 (the H200s).
TESTED = ("2.11.0", "2.13.0")
LOWEST, BELOW = "2.11", "2.14"  # the range: LOWEST <= torch < BELOW

# (module, attribute, where sprite uses it)
PRIVATE = (
    ("torch.storage", "_get_dtype_from_pickle_storage_type", "dcp_read: a stored tensor's dtype from its pickle"),
    ("torch._utils", "_rebuild_tensor_v2", "dcp_read: the one call a plain tensor's data.pkl may name"),
    ("torch.distributed._shard._utils", "narrow_tensor_by_index", "dcp_read: a stored chunk of a tensor"),
    ("torch.distributed.checkpoint.default_planner", "_EmptyStateDictLoadPlanner", "dcp_read: consolidation"),
    ("torch.distributed.checkpoint.state_dict_loader", "_load_state_dict", "dcp_read: consolidation"),
    ("torch.distributed.distributed_c10d", "_get_default_store", "finish: the rendezvous store at shutdown"),
    # checked on 2.13.0 CPU only (gloo records there); hang.recorder falls back to "could not be read" without it
    ("torch._C._distributed_c10d", "_dump_fr_trace_json", "hang.recorder: the flight recorder's collectives"),
)

# torch's environment variable that makes its checkpoint processes (process mode) join the run's own TCPStore at
# MASTER_ADDR:MASTER_PORT under a prefix, instead of a store on a port rank 0 picks by binding port 0 and lets go for
# its checkpoint process to bind later (another process may take it meanwhile: EADDRINUSE at the first save). Read by
# torch/distributed/checkpoint/_async_process_executor.py (_ProcessGroupInitInfo), checked on 2.11.0
# (docs/runs/h200-2026-12-04-c) and 2.13.0 (tests/test_ckpt_resume.py); if torch stops reading it, it picks a port as
# before. Set by dcp_write.prefix_store.
DCP_PREFIX_STORE = "DCP_USE_PREFIX_STORE"

# The module of torch's checkpoint process (process mode), which logs on the root logger three INFO lines a save;
# dcp_write.quiet_checkpoint_process drops those by this module's file. Checked on 2.11.0 and 2.13.0
# (tests/test_torch_range.py); were torch to move it, the lines would show again and nothing else would change.
DCP_PROCESS_MODULE = "torch.distributed.checkpoint._async_process_executor"

# Python logging's name for torch.distributed.checkpoint's logger: torch sets it to DEBUG with a NullHandler
# (torch/distributed/c10d_logger.py), so every staged item builds log records nobody reads; dcp_write raises it.
DCP_LOGGER = "c10d-NullHandler-dcp_logger"


def missing() -> list[str]:
    """The names of ``PRIVATE`` the installed torch lacks, as ``module.attribute``."""
    import importlib

    gone = []
    for module, name, _ in PRIVATE:
        try:
            if not hasattr(importlib.import_module(module), name):
                gone.append(f"{module}.{name}")
        except ImportError:
            gone.append(f"{module}.{name}")
    return gone
