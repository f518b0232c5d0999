"""The diagnosis of a stall: ranks grouped by where they were, and the rank that differs named (pure functions).

Ranks whose phrase (where.py) and flight recorder state are the same, and alike in all the rules below read, form
one group, so 12 or 12,000 ranks give a few lines. The likely culprit, tried in this order:

0. some ranks finished the script (their heartbeat says done) and others did not: the others, since the
   finished ranks will never join them (a collective under a rank guard, such as a save by rank 0 alone);
1. some ranks wait for the others (in a collective, in backward where DDP all-reduces, or with a collective the
   flight recorder shows unfinished) while the rest are elsewhere: the ranks elsewhere, since the others wait
   for them;
2. every rank waits and the flight recorder gives each one's sequence number: the ranks furthest behind;
3. every rank waits, in different places, and only some called their collective from their own code: those
   (a collective the others never reached);
4. one group smaller than every other: its ranks;
5. otherwise none is named (every rank in the same place, or no rule tells them apart).
Ranks without stacks are listed but never judged.
"""

from __future__ import annotations

from dataclasses import dataclass

import hostlist

from sprite.errors import one_line
from sprite.recovery.hang.where import NONE, WAITING, Where
from sprite.recovery.watchdog import ranges

MAX_GROUPS = 8  # lines printed at most; the rest are counted
LINE_MAX = 400  # characters of one line at most


@dataclass(frozen=True)
class RankState:
    rank: int
    host: str
    where: Where
    recorder: str = ""  # the flight recorder's phrase (where.collectives)
    seq: int | None = None  # the default group's last enqueued collective
    pending: bool = False  # the flight recorder shows a collective of this rank not completed
    done: bool = False  # the rank's heartbeat says it finished the script

    @property
    def waiting(self) -> bool:
        return self.where.kind in WAITING or self.pending or self.done

    @property
    def text(self) -> str:
        return ("done with the script, " if self.done else "") + self.where.text


@dataclass(frozen=True)
class Diagnosis:
    lines: tuple[str, ...]  # one per group, the culprit's first
    culprits: tuple[int, ...]
    reason: str


def groups(states: dict[int, RankState], named: frozenset | set = frozenset()) -> list[list[RankState]]:
    """Ranks with the same phrase and recorder state, and the same in everything the culprit rules read (waiting,
    sequence number, a collective of their own), each group in rank order, groups by their first rank. The
    recorder's phrase shows three process groups at most, so two ranks may print alike and still differ; ranks in
    ``named`` (the culprits) never share a group with others."""
    found: dict[tuple, list[RankState]] = {}
    for state in sorted(states.values(), key=lambda s: s.rank):
        key = (state.text, state.recorder, state.waiting, state.seq, state.where.direct, state.rank in named)
        found.setdefault(key, []).append(state)
    return sorted(found.values(), key=lambda group: group[0].rank)


def culprits(states: dict[int, RankState]) -> tuple[set[int], str]:
    """The likely culprit ranks and why, by the module docstring's rules; (set(), "") when none is named."""
    known = {rank: s for rank, s in states.items() if s.where.kind != NONE or s.done}
    done = {rank for rank, s in known.items() if s.done}
    if done and len(done) < len(known):
        return set(known) - done, "still in the script after the other ranks finished it"
    waiting = {rank for rank, s in known.items() if s.waiting}
    elsewhere = set(known) - waiting
    if waiting and elsewhere:
        return elsewhere, "not in a collective while the others wait in one"
    found = groups(known)
    if len(found) < 2:
        return set(), ""
    if waiting:
        seqs = {rank: s.seq for rank, s in known.items() if s.seq is not None}
        if len(seqs) == len(known) and len(set(seqs.values())) > 1:
            low = min(seqs.values())
            return ({rank for rank, seq in seqs.items() if seq == low},
                    f"behind in the collectives (#{low} where others reached #{max(seqs.values())})")
        direct = {rank for rank, s in known.items() if s.where.direct}
        if direct and direct != set(known):
            return direct, "called a collective from its own code that the others did not reach"
    sizes = sorted(len(group) for group in found)
    if sizes[0] < sizes[1]:
        smallest = next(group for group in found if len(group) == sizes[0])
        return {s.rank for s in smallest}, "the only ones in this place"
    return set(), ""


def diagnose(states: dict[int, RankState]) -> Diagnosis:
    """One line per group (at most MAX_GROUPS, then a count), the culprit's group first."""
    named, reason = culprits(states)
    found = groups(states, named)
    found.sort(key=lambda group: (group[0].rank not in named, group[0].rank))
    lines = []
    for group in found[:MAX_GROUPS]:
        ranks = [s.rank for s in group]
        noun = "rank" if len(ranks) == 1 else "ranks"
        hosts = sorted({s.host for s in group if s.host})
        text = f"{noun} {ranges(ranks)}{' on ' + hostlist.collect_hostlist(hosts) if hosts else ''}: "
        text += group[0].text + (f"; collectives: {group[0].recorder}" if group[0].recorder else "")
        if ranks[0] in named:
            text += f" <- the likely culprit: {reason}"
        elif named and group[0].waiting:
            text += f", for {'rank' if len(named) == 1 else 'ranks'} {ranges(named)}"
        lines.append(one_line(text, LINE_MAX))
    if len(found) > MAX_GROUPS:
        lines.append(f"... and {len(found) - MAX_GROUPS} more groups of ranks")
    return Diagnosis(tuple(lines), tuple(sorted(named)), reason)
