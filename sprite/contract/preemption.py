"""The preemption signal: which one sprite uses by default, which launchers pass it on, what else may take it.

On this signal every rank finishes its step, the ranks agree, save a checkpoint and exit with
``errors.EXIT_PREEMPTED`` (``sprite/runtime/preempt.py``); ``sprite run`` then asks the scheduler to run the job
again (``Scheduler.requeue_argv``). Torch-free: planning and the job scripts use it.

Why SIGUSR1 is the default (sources read 2026-11-29):
- NCCL took SIGUSR1 for a proxy-state dump from 2.12.7 to 2.13.x (src/proxy.cc:601 at 2.12.7-1, NVIDIA/nccl#704);
  since 2.14.3 it installs that handler only when NCCL_PROXY_DUMP_SIGNAL names a signal (src/proxy.cc:924-965),
  and then it may be SIGUSR1 or SIGUSR2 alike: ``conflicts`` refuses that setting for the chosen signal.
- oneCCL installs no SIGUSR1/SIGUSR2 handler (only SIGTERM, in its resizable PMI:
  src/atl/util/pm/pmi_resizable_rt/pmi_resizable/resizable_pmi.cpp:277).
- submitit moved to SIGUSR2 because of that NCCL release (submitit/core/job_environment.py:32-35, PR #1697).
- MPICH Hydra's mpiexec catches INT, QUIT, TERM, USR1 and ALRM and passes them to every rank
  (src/pm/hydra/lib/utils/signals.c:40-60, mpiexec/pmiserv_pmci.c:56-61, proxy/pmip_cb.c:505-509) but not
  SIGUSR2, which ends mpiexec and its ranks (seen here: MPICH 5 wheel, exit 140, no rank handler ran).
  torchrun's agent catches neither and dies of both (torch/distributed/elastic/multiprocessing/api.py:538-546).
- Lightning uses SIGUSR1 only inside its own SLURMEnvironment (fabric/plugins/environments/slurm.py:50-51), and
  registers it only when no handler exists yet (pytorch/trainer/connectors/signal_connector.py:53-62); sprite's
  ranks have their own environment and install their handler first.
So SIGUSR1 reaches the ranks through every launcher sprite drives here; SIGUSR2 does not through Hydra.
"""

from __future__ import annotations

import signal
from typing import Mapping

from sprite.errors import UsageError

DEFAULT = "USR1"
NONE = "none"
# Which of the two signals each launcher flavour passes on to its ranks when it receives it. srun: "Signals sent
# to the srun command are automatically forwarded to the tasks" (srun(1), SIGNALS AND ESCAPE SEQUENCES); Open MPI's
# mpirun forwards SIGUSR1 and SIGUSR2 by default (open-mpi/ompi#2726); sprite's supervisor passes both on.
# PALS: no public documentation found and no PALS here: assumed to pass both, unverified.
PASSES_ON = {"local": ("USR1", "USR2"), "srun": ("USR1", "USR2"), "hydra": ("USR1",), "openmpi": ("USR1", "USR2"),
             "pals": ("USR1", "USR2"), "torchrun": ()}
# Variables with which NCCL installs its own handler for the signal they name (NCCL >= 2.14.3).
NCCL_DUMP = ("NCCL_PROXY_DUMP_SIGNAL", "NCCL_RMA_PROXY_DUMP_SIGNAL")


def signum(name: str) -> int:
    """The signal number of ``USR1`` / ``USR2``."""
    return int(getattr(signal, "SIG" + name))


def effective(chosen: str | None) -> str:
    """The signal a plan exports: the one chosen (flag, spec or site), else the default."""
    return chosen or DEFAULT


def check_launcher(chosen: str | None, flavour: str) -> None:
    """Refuse a signal the launcher would not pass on to the ranks when the user chose it explicitly (the default
    stays: the ranks may still receive it straight from the scheduler).

    Raises:
        UsageError: the chosen signal ends this launcher instead of reaching the ranks.
    """
    if chosen in (None, NONE) or chosen in PASSES_ON.get(flavour, (chosen,)):
        return
    passes = " or ".join(f"--preempt-signal {name}" for name in PASSES_ON[flavour]) or "--preempt-signal none"
    raise UsageError(f"The {flavour} launcher does not pass SIG{chosen} on to the ranks; it ends when it receives it.",
                     "Each launcher catches only some signals (sprite/contract/preemption.py lists what each passes on).",
                     f"Use {passes}, or another launcher.")


def conflicts(name: str, environ: Mapping[str, str]) -> str:
    """The variable that makes NCCL take the preemption signal ``name`` for itself, "" when none does."""
    number = str(signum(name))
    for variable in NCCL_DUMP:
        value = environ.get(variable, "").strip().upper().removeprefix("SIG")
        if value in (number, name):
            return f"{variable}={environ[variable]}"
    return ""
