"""What a rank tells the user and the run's record: one line on stderr, a record appended to the audit trail when
``SPRITE_RUN_DIR`` names a run folder."""

from __future__ import annotations

import os
import sys

from sprite import contract
from sprite.integrity import audit as audit_trail

AUDIT_NAME = "audit.jsonl"


def say(message: str) -> None:
    """One line on stderr, prefixed like every sprite message (callers decide which rank speaks)."""
    print(f"sprite: {message}", file=sys.stderr, flush=True)


def _trail() -> str | None:
    run_dir = os.environ.get(contract.RUN_DIR, "").strip()
    return os.path.join(run_dir, AUDIT_NAME) if run_dir else None


def audit(kind: str, **fields) -> None:
    """Append a record to ``$SPRITE_RUN_DIR/audit.jsonl`` when the variable is set (callers: rank 0 only)."""
    path = _trail()
    if path:
        audit_trail.append(path, kind, **fields)
