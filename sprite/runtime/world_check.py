"""No silent one-process worlds: a launch of N > 1 ranks whose script trained in a smaller world is reported.

Whatever the script kind (Trainer, Fabric, plain torch.distributed, or no distributed code at all), this process
notes the largest process group it joined. When the script has returned, a rank of a launched world of N > 1 that
joined none (or a smaller one) says so: rank 0 prints one warning line, and under ``--strict``
(``SPRITE_CHECKS=strict``) every such rank stops with it as an error. A group made without
``torch.distributed.init_process_group`` (``init_device_mesh`` binds its own reference) is noted when the script
returns, so only one the script also destroyed itself goes unseen.
"""

from __future__ import annotations

import functools
import os
import sys

from sprite import contract
from sprite.contract import store_ready

from sprite.runtime.checks import findings

_joined = 0  # the largest world size this process has been part of
_kind = ""  # "Trainer", "Fabric" or "plain torch.distributed": what joined the world first
_rank = 0


def seen(kind: str) -> None:
    """Note the script's kind the first time one shows itself. For a Fabric or plain script, rank 0 says once
    which of the launch's long-run features only a Trainer fit gets (docs/scripts.md), so none is silently absent."""
    global _kind
    if _kind:
        return
    _kind = kind
    if kind == "Trainer" or _rank != 0:
        return
    env = os.environ
    missing = [what for what, on in (
        (f"checkpoint-and-stop on SIG{env.get(contract.PREEMPT_SIGNAL, '')}",
         env.get(contract.PREEMPT_SIGNAL, "none") not in ("", "none")),
        (f"--resume {env.get(contract.RESUME, '')}", env.get(contract.RESUME, "never") not in ("", "never")),
        ("fit-start checks (--strict)", env.get(contract.CHECKS) == "strict"),
    ) if on]
    if missing:
        print(f"{findings.WARNING}a {kind} script gets no {' and no '.join(missing)}: those act on Lightning Trainer"
              " fits only (docs/scripts.md). Checkpoint in the script itself; report steps to the stall watchdog"
              " with sprite.beat(step).", file=sys.stderr, flush=True)


def install(rank: int = 0) -> None:
    """Note the world size after every ``torch.distributed.init_process_group``, whoever calls it (and, on a rank
    other than 0, wait first until rank 0's store listens: sprite.contract.store_ready).

    Workaround for the lack of a public hook: Lightning calls it as ``torch.distributed.init_process_group``
    (Lightning 2.6.6 fabric/utilities/distributed.py:_init_dist_connection) and scripts as ``dist.init_process_group``,
    so both look the attribute up on the module at call time and find this wrapper.
    """
    import torch.distributed as dist

    global _rank
    _rank = rank
    original = dist.init_process_group
    if getattr(original, "_sprite_world", False):
        return

    @functools.wraps(original)
    def init_process_group(*args, **kwargs):
        seen("plain torch.distributed")  # a Trainer or Fabric noted itself before Lightning got here
        store_ready.before_init(args, kwargs)  # rank 0's store listens before torch connects (no backoff)
        result = original(*args, **kwargs)
        note()
        return result

    init_process_group._sprite_world = True
    dist.init_process_group = init_process_group


def note() -> None:
    """Record the current process group's size (nothing without one)."""
    global _joined
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        _joined = max(_joined, dist.get_world_size())


def one_process_world(launched: int, joined: int) -> findings.Finding:
    what = (f"{launched} ranks were launched, but this script never joined a process group: every rank ran alone."
            if joined == 0 else f"{launched} ranks were launched, but this script's process group had {joined}"
            " rank(s): the ranks trained separate worlds.")
    return findings.Finding(
        what,
        "The script has no distributed code, or hard-codes a world (devices=1, a world_size argument).",
        "Call torch.distributed.init_process_group() (sprite exports RANK, WORLD_SIZE, MASTER_ADDR/PORT), leave"
        " devices/num_nodes unset in Trainer or Fabric, or launch one rank.",
    )


def check(launched: int, rank: int, mode: str) -> None:
    """Report a world smaller than ``launched`` after the script returned (see the module docstring).

    Raises:
        UsageError: under ``mode == "strict"``, on every rank that ran in a smaller world.
    """
    note()
    if launched > 1 and _joined < launched:
        findings.report(one_process_world(launched, _joined), mode, rank_zero=rank == 0)
