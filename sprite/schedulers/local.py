"""No batch system: this machine alone (a laptop, a CI box, a login node's own cores)."""

from __future__ import annotations

from typing import Callable, Mapping

from sprite.schedulers.allocation import Allocation
from sprite.schedulers.base import Scheduler


class NoScheduler(Scheduler):
    name = "none"
    auto_launcher = "local"

    def detect(self, environ: Mapping[str, str]) -> bool:
        return True  # the fallback: always "here"

    def allocation(self, environ: Mapping[str, str], read: Callable[[str], str], hostname: str) -> Allocation:
        return Allocation(self.name, "", (hostname,))
