"""What the fit-start checks can find, each as one bounded line: what happened, the usual cause, the fix.

Pure message builders plus :func:`report`, which prints a finding as a warning on rank 0 or, under
``--strict``, raises it as an error on every rank (every rank finds the same, so every rank stops).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Optional, TextIO

from sprite.errors import UsageError, one_line

WARNING = "sprite: warning: "
_MAX_VALUE = 40  # characters of a user's value quoted in a message


@dataclass(frozen=True)
class Finding:
    what: str
    cause: str
    fix: str

    def line(self) -> str:
        return one_line(" ".join(part for part in (self.what, self.cause, self.fix) if part))


def _ranks(ranks: list[int]) -> str:
    return ", ".join(str(r) for r in ranks)


def shared_batches(groups: list[list[int]], world: int) -> Finding:
    """Ranks (global ranks, each group sharing one first training batch) that train on the same data."""
    if len(groups) == 1 and len(groups[0]) == world:
        what = f"Every rank ({world} of {world}) got the same first training batch, so every rank trains the same data."
    else:
        what = "Ranks " + "; ".join(_ranks(g) for g in groups) + " got the same first training batch, so they" \
               " train the same data."
    return Finding(
        what,
        "Lightning does not shard an IterableDataset, and a custom sampler may ignore the rank.",
        "Shard by rank and worker inside the dataset (torch.distributed.get_rank(), get_worker_info()), or use a"
        " map-style dataset and let Lightning add a DistributedSampler.",
    )


def padded_evaluation(stage: str, length: int, world: int, repeated: int) -> Finding:
    """A ``stage`` ("validation"/"test") set of ``length`` samples padded by ``repeated`` over ``world`` ranks."""
    per_rank = (length + repeated) // world
    return Finding(
        f"The {stage} set has {length} samples on {world} ranks: DistributedSampler repeats {repeated} of them so"
        f" every rank gets {per_rank}, and metrics logged in {stage} count those duplicates.",
        f"{length} is not divisible by the world size.",
        "Evaluate on one device (a separate Trainer(devices=1) run, e.g. sprite run --devices 1), or use a"
        " non-duplicating distributed evaluator with Trainer(use_distributed_sampler=False).",
    )


def nccl_timeout(value: str, device: str) -> Finding:
    """``NCCL_TIMEOUT`` in the environment of a run on ``device`` ("xpu", "cuda", "cpu")."""
    shown = value if len(value) <= _MAX_VALUE else value[:_MAX_VALUE] + "..."
    # Seed 001; no Python source of torch 2.13 or Lightning 2.6.6 reads it (grep here; the CUDA build's C++ unread).
    what = (f"NCCL_TIMEOUT={shown!r} is set, but it is not a process-group timeout: the process group takes its"
            " timeout from the strategy.")
    if device == "xpu":
        # torch 2.13 distributed_c10d.py:1644-1661: _set_pg_timeout handles gloo and nccl only (seed 002, Aurora).
        return Finding(what, "On XPU no process-group timeout is enforced: the xccl timeout is stored, never applied.",
                       "Stop a hung run with sprite run --stall-timeout instead.")
    # Lightning 2.6.6 fabric/plugins/collectives/torch_collective.py:14: DDP's and FSDP's default is 30 minutes.
    return Finding(what, "A hung collective waits for the strategy's timeout, 30 minutes unless the script sets it.",
                   "Pass the strategy's timeout, e.g. DDPStrategy(timeout=timedelta(minutes=10)), or stop a hung"
                   " run with sprite run --stall-timeout.")


def foreign_strategy(name: str, world: int) -> Finding:
    """A strategy sprite does not launch (FSDP1, DeepSpeed) built in a launched world of ``world`` ranks."""
    return Finding(
        f"The script builds Lightning's {name} in a sprite launch of {world} ranks.",
        "sprite launches DDP and FSDP2 only.",
        "Remove strategy= from the Trainer and launch with sprite run --strategy ddp or --strategy fsdp (FSDP2).",
    )


def spawning_strategy(name: str, method: str, world: int) -> Finding:
    """A DDP that starts its own processes (``ddp_spawn``, ``ddp_fork``) inside a launched world."""
    return Finding(
        f"The script builds Lightning's {name} (start method {method!r}) in a sprite launch of {world} ranks.",
        f"sprite launches DDP and FSDP2 in the ranks it started; {method} would start a second world inside each"
        " rank.",
        "Remove strategy= from the Trainer (sprite fills in DDP) or use strategy='ddp'.",
    )


def report(finding: Finding, mode: str, rank_zero: bool, stream: Optional[TextIO] = None) -> None:
    """Print ``finding`` as one warning line on rank 0, or raise it under ``mode == "strict"``.

    Raises:
        UsageError: ``mode`` is "strict" (exit code 2), on every rank.
    """
    if mode == "strict":
        raise UsageError(finding.what, finding.cause, finding.fix + " (an error because of --strict)")
    if rank_zero:
        print(WARNING + finding.line(), file=stream or sys.stderr, flush=True)
