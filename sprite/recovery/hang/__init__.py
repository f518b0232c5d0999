"""Hang diagnosis (issue 27): when the watchdog stops a stalled run, say where every rank was.

Each rank wrote its own stacks and flight recorder summary into ``stacks/attempt-N/`` (sprite.runtime.hang);
``collect`` waits a few seconds for the ranks that have not written yet, reads every file (bounded, never through
a symlink), and ``diagnose.py`` groups the ranks and names the likely culprit. Torch-free: ``sprite runs show``
prints the same diagnosis from the audit trail.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from sprite.contract import stacks
from sprite.recovery.hang import diagnose
from sprite.recovery.hang import where as places
from sprite.recovery.hang.diagnose import Diagnosis, RankState
from sprite.recovery.hang.frames import Dump, parse
from sprite.recovery.watchdog import heartbeat_seconds

WAIT = 3.0  # seconds the watchdog waits at most for ranks that have not dumped yet


def collect(folder: Path, world_size: int, hosts: dict[int, str], wait: float = WAIT,
            clock=time.monotonic, sleep=time.sleep, done: frozenset = frozenset()) -> Diagnosis:
    """The diagnosis from the stack files in ``folder`` (``hosts``: rank -> host from the heartbeats; ``done``:
    the ranks whose heartbeat says they finished the script), after waiting up to ``wait`` seconds for every
    rank's dump."""
    deadline, dumps = clock() + wait, {}
    while True:
        for rank in range(world_size):
            if rank not in dumps or not dumps[rank].dumped:
                dumps[rank] = read_dump(folder, rank)
        if all(d.dumped for d in dumps.values()) or clock() >= deadline:
            break
        sleep(0.2)
    quotes: dict = {}

    def quote(frame):
        if (frame.path, frame.line) not in quotes:
            quotes[frame.path, frame.line] = places.source_line(frame)
        return quotes[frame.path, frame.line]

    states = {}
    for rank, dump in dumps.items():
        summary = read_collectives(folder, rank) if dump.dumped else None
        recorder, seq = places.collectives(summary)
        host = hosts.get(rank) or str(dump.header.get("host", ""))
        states[rank] = RankState(rank, host, places.of(dump if dump.dumped else None, quote), recorder, seq,
                                 places.pending(summary), rank in done)
    return diagnose.diagnose(states)


def read_dump(folder: Path, rank: int) -> Dump:
    data = stacks.read(folder / stacks.stacks_name(rank), stacks.STACKS_MAX)
    return parse(data.decode(errors="replace")) if data else Dump({}, [])


def read_collectives(folder: Path, rank: int) -> dict | None:
    data = stacks.read(folder / stacks.collectives_name(rank), stacks.COLLECTIVES_MAX)
    try:
        found = json.loads(data) if data else None
    except (ValueError, RecursionError):
        return None
    return found if isinstance(found, dict) else None


def after(limits) -> stacks.After:
    """When a rank dumps its stacks (SPRITE_STACKS_AFTER) for the watchdog's ``limits``: each limit less two
    heartbeat intervals (a rank re-arms at most one interval late, and the watchdog sees its progress at most one
    interval late), never less than half the limit, so every dump is on disk before the watchdog stops the run."""
    margin = 2 * heartbeat_seconds(limits)
    return stacks.After(*(round(max(limit - margin, limit / 2), 3)
                          for limit in (limits.stall, limits.first_step, limits.save)))


def lines(diagnosis: Diagnosis, folder: Path) -> list[str]:
    """The lines sprite prints after its stall line: one per group, then where the stacks are."""
    return [*(f"sprite: stall: {line}" for line in diagnosis.lines),
            f"sprite: stall: every rank's stacks and collectives are in {folder}/"]


def from_records(records: list[dict]) -> list[str]:
    """What ``sprite runs show`` prints of a run's stalls: per stall record, its line and its diagnosis."""
    out = []
    for record in records:
        if record.get("kind") != "stall":
            continue
        out.append(f"attempt {record.get('attempt')} stalled: no rank advanced for {record.get('idle_seconds')} s "
                   f"({record.get('allowance')} {record.get('limit_seconds')} s): {record.get('ranks')}")
        diagnosis = record.get("diagnosis")
        if isinstance(diagnosis, list):
            out += [f"  {line}" for line in diagnosis if isinstance(line, str)]
            out.append(f"  stacks: {record.get('stacks')}/")
        else:
            out.append("  no diagnosis (a run without stack dumps)")
    return out
