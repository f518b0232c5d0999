"""The preemption signal's handler in a rank: it only records that the signal came (stdlib only, so
``python -m sprite.runtime`` installs it before the seconds-long torch and Lightning imports)."""

from __future__ import annotations

import signal
from typing import Mapping, Optional

from sprite import contract
from sprite.contract import preemption
from sprite.errors import UsageError

received: list[int] = []  # signal numbers this process received; read at step boundaries by preempt.py
_installed: list[int] = []  # the signal install() handles in this process


def _on_signal(signum, frame) -> None:
    received.append(signum)


def name_received() -> str:
    """The name of the first preemption signal received ("" when none came)."""
    return signal.Signals(received[0]).name if received else ""


def install(environ: Mapping[str, str]) -> Optional[str]:
    """Handle the contract's preemption signal in this process; returns its name (None: not asked, or "none").

    Raises:
        UsageError: the value is not a signal sprite handles, or an NCCL setting takes the same signal.
    """
    name = environ.get(contract.PREEMPT_SIGNAL, "").strip()
    if not name or name == preemption.NONE:
        return None
    if name not in contract.PREEMPT_SIGNALS:
        raise UsageError(f"{contract.PREEMPT_SIGNAL}={name!r} is not allowed.", "sprite run never exports it so.",
                         f"Use one of: {', '.join(contract.PREEMPT_SIGNALS)}.")
    taken = preemption.conflicts(name, environ)
    if taken:
        other = "USR2" if name == "USR1" else "USR1"
        raise UsageError(f"{taken} makes NCCL take SIG{name} for a debug dump, so the ranks would never see the "
                         "preemption signal.", "NCCL installs that handler when the variable names a signal.",
                         f"Unset it, or launch with --preempt-signal {other}.")
    signal.signal(preemption.signum(name), _on_signal)
    _installed[:] = [preemption.signum(name)]
    return name


def reinstall() -> None:
    """Install the handler again where Python still believes it holds the signal.

    A C library can take the signal beneath Python with its own ``sigaction``: Python's ``signal.getsignal`` still
    names this handler, but the kernel calls the library's. MPI's start-up did so in a rank on one H200 (Open MPI
    4.1.6: the rank never saw the preemption signal; docs/runs/h200-2026-12-03-c). Called as training starts, after
    the process group, the devices and the script's own imports are set up. A handler the script installed itself
    is left alone."""
    for signum in _installed:
        if signal.getsignal(signum) is _on_signal:
            signal.signal(signum, _on_signal)
