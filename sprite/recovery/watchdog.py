"""The stall watchdog's decisions, as pure functions of the ranks' heartbeats and sprite's own clock.

A run stalls when no rank's heartbeat changes for longer than the limit in force: the start-up allowance until
some rank has finished its first training step of this attempt, the save allowance while any rank is in a
checkpoint save, the exit allowance (as long as the start-up one) once every rank of the world is done with the
script or stopped for preemption and only has to leave, else the stall timeout. Times are sprite's monotonic clock, never the ranks' (clocks of
different hosts disagree).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import hostlist

from sprite.contract import heartbeat
from sprite.contract.heartbeat import Beat
from sprite.values.grammar import MAX_SECONDS

_PHASE_TEXT = {heartbeat.START: "in start-up", heartbeat.TRAINING: "in training step",
               heartbeat.VALIDATION: "in validation", heartbeat.SAVE: "in checkpoint save",
               heartbeat.DONE: "done with the script", heartbeat.PREEMPTED: "stopped for preemption",
               heartbeat.FAILED: "failed"}
# Seconds a launch may go on after sprite read that one of its ranks failed (heartbeat.FAILED) before it stops it:
# the failing rank marks itself in the store, leaves a gloo group within 10 s (runtime/finish.py) and then prints
# its error; peers blocked in a collective with it would otherwise wait for their backend's timeout (30 min under
# Lightning), since mpiexec (MPICH Hydra, seen here; PALS not tried) does not end the other ranks when one exits
# non-zero.
FAILED_GRACE = 30.0



@dataclass(frozen=True)
class Limits:
    """Seconds without progress that end a run: in general, before the first step, during a checkpoint save."""

    stall: float
    first_step: float
    save: float

    @classmethod
    def from_options(cls, stall: float, first_step: float | None = None, save: float | None = None) -> "Limits":
        """Defaults: start-up gets 10x the stall timeout (at least 300 s), a save 2x; neither less than ``stall``,
        nor more than the ten years (MAX_SECONDS) any option may give, so the ranks can read the dump times made
        of them (contract/stacks.py After.parse): 10x a stall timeout of 3e8 s is past what they accept."""
        return cls(stall, min(max(stall, first_step if first_step else max(10 * stall, 300.0)), MAX_SECONDS),
                   min(max(stall, save if save else 2 * stall), MAX_SECONDS))


# What each allowance's stop line says: the usual cause, what the limit covers, and the option that sets it.
_ALLOWANCES = {
    "stall timeout": ("The usual cause is a collective that not every rank reached (a save, log or barrier under a "
                      "rank-zero guard), a hung device or a lost node.", "a step", "--stall-timeout"),
    "first-step allowance": ("No rank reported a training step and the output stayed silent: a hang in start-up, or a"
                             " script without a Lightning Trainer that reports no steps (add sprite.beat(step) to its "
                             "loop).", "start-up", "--first-step-timeout"),
    "save allowance": ("A checkpoint save did not end: the usual cause is a save that not every rank entered (under a "
                       "rank-zero guard), or a slow or full file system.", "a save", "--save-timeout"),
    "exit allowance": ("Every rank was done with the script but the launch did not end: a rank stuck while leaving "
                       "(the process group's teardown, an atexit handler, a thread that is not a daemon).",
                       "leaving", "--first-step-timeout (it sets the exit allowance too)"),
}
SUMMARY_GROUPS = 8  # clauses of the stop line's summary at most; the rest are counted
PART_MAX = 120  # characters of one clause's rank list or host list at most


@dataclass(frozen=True)
class Stall:
    """A stopped run: how long nothing moved, the limit that applied, where the ranks were (summarize), and the
    hosts whose ranks all fell behind (suspects)."""

    idle: float
    limit: float
    allowance: str  # one of _ALLOWANCES: "stall timeout", "first-step allowance", "save allowance", "exit allowance"
    summary: str
    suspect_hosts: tuple[str, ...] = ()

    def message(self) -> str:
        """What stopped, the cause and the fix, then where the ranks were: the summary last, so the classifier and
        a person read the cause even where a long line is cut (errors.MAX_MESSAGE)."""
        cause, what, option = _ALLOWANCES.get(self.allowance, _ALLOWANCES["stall timeout"])
        if self.suspect_hosts:
            cause = ("The ranks on some hosts fell behind the others in a training step: a node fault is likely "
                     f"(suspect hosts: {_suspects_text(self.suspect_hosts)}).")
        return (f"Stopped the run: no rank advanced for {self.idle:.0f} s ({self.allowance} {self.limit:g} s). "
                f"{cause} Look at what the named ranks were doing; raise {option} if {what} really takes this long. "
                f"Where the ranks were: {self.summary}.")


def _suspects_text(hosts: tuple[str, ...], shown: int = 16) -> str:
    """The suspect hosts, comma-separated; past ``shown`` of them, a count ("and N more"), which classify.py's
    reading of the line takes for no list at all (attempt.py hands it the Stall's own hosts)."""
    head = ",".join(hosts[:shown])
    return head if len(hosts) <= shown else f"{head} and {len(hosts) - shown} more"


@dataclass
class Watch:
    """Follows the heartbeats of one attempt; ``observe`` returns a Stall once the limit in force is passed."""

    limits: Limits | None  # None: only follow progress, never stop
    world_size: int
    started: float
    _seen: dict = field(default_factory=dict)
    _last_change: float | None = None
    _output: int | None = None
    progressed: bool = False  # some rank got past its first training step in this attempt
    failed_at: float | None = None  # when a rank's heartbeat first said it failed

    def observe(self, beats: dict[int, Beat], now: float, output: int | None = None) -> Stall | None:
        """``output``: how many bytes the launch has printed so far. While no rank has reported a phase past
        start-up (a Fabric or plain script that never calls sprite.beat), new output counts as progress, as
        ezpz's watchdog counts it; once heartbeats report steps, only they count."""
        if self._last_change is None:
            self._last_change = self.started
        if output is not None and output != self._output:
            if self._output is not None and all(beat.phase == heartbeat.START for beat in beats.values()):
                self._last_change = now
            self._output = output
        for rank, beat in beats.items():
            if self._seen.get(rank) != (beat.pid, beat.count):
                self._seen[rank] = (beat.pid, beat.count)
                self._last_change = now
            self.progressed |= beat.past_first_step
            if beat.phase == heartbeat.FAILED and self.failed_at is None:
                self.failed_at = now
        if self.limits is None or self.failed_at is not None:  # a failed rank's error is the cause, not a stall
            return None
        limit, allowance = self.limit_in_force(beats)
        idle = now - self._last_change
        if idle <= limit:
            return None
        return Stall(idle, limit, allowance, summarize(beats, self.world_size), suspects(beats, self.world_size))

    def failure_overdue(self, beats: dict[int, Beat], now: float) -> str | None:
        """The line that stops the launch once sprite saw a rank's heartbeat say it failed FAILED_GRACE seconds ago
        and the launch goes on; None otherwise. From then on ``observe`` reports no stall: the failure is the
        attempt's cause, whatever the stall timeout."""
        if self.failed_at is None or now - self.failed_at <= FAILED_GRACE:
            return None
        failed = sorted(rank for rank, beat in beats.items() if beat.phase == heartbeat.FAILED)
        who = f"rank(s) {ranges(failed)}" if failed else "a rank"
        return (f"Stopped the launch: {who} failed {now - self.failed_at:.0f} s ago (the error is "
                f"in their output above or in their rank logs), and the launcher did not end the other ranks: "
                f"{summarize(beats, self.world_size)}. The failing rank's error is the run's; fix it and relaunch, or "
                "let --retries relaunch it.")

    def limit_in_force(self, beats: dict[int, Beat]) -> tuple[float, str]:
        if any(beat.phase == heartbeat.SAVE for beat in beats.values()):
            return self.limits.save, "save allowance"
        if len(beats) == self.world_size and all(beat.phase in heartbeat.ENDED for beat in beats.values()):
            # Every rank has finished training; leaving (destroying the process group, interpreter exit) can
            # take longer than a step under load: seen at load 10 with --stall-timeout 5 (issue 30's scenarios).
            return self.limits.first_step, "exit allowance"
        if not self.progressed:
            return self.limits.first_step, "first-step allowance"
        return self.limits.stall, "stall timeout"


def ranges(numbers) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2,5"``."""
    out, run = [], []
    for n in sorted(numbers):
        if run and n != run[-1] + 1:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
            run = []
        run.append(n)
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


def _cut(text: str, limit: int = PART_MAX) -> str:
    """``text`` (a comma list) cut after its last whole item within ``limit`` characters, then "..."."""
    return text if len(text) <= limit else text[:limit].rsplit(",", 1)[0] + ",..."


def _group_text(ranks: list[int], hosts: set[str], what: str) -> str:
    noun = "rank" if len(ranks) == 1 else "ranks"
    numbers = ranges(ranks)
    numbers = numbers if len(numbers) <= PART_MAX else f"{_cut(numbers)} ({len(ranks)} ranks)"
    where = hostlist.collect_hostlist(sorted(hosts)) if hosts else ""
    if len(where) > PART_MAX:  # scattered names (x1234c5s6b0n0 ...) do not fold into a short host list
        where = f"{len(hosts)} hosts ({hostlist.collect_hostlist(sorted(hosts)[:3])},...)"
    return f"{noun} {numbers}{' on ' + where if where else ''} {what}"


def summarize(beats: dict[int, Beat], world_size: int) -> str:
    """One clause per (phase, step) group, e.g. "rank 0 on h1 in checkpoint save at step 3; ranks 1-3 on h1 in
    training step at step 4"; ranks that never wrote a heartbeat are named as such. Bounded whatever the world:
    at most SUMMARY_GROUPS clauses (then how many more groups and ranks), each rank and host list cut to PART_MAX
    characters with a count."""
    groups: dict[tuple[str, int], list[Beat]] = {}
    for beat in sorted(beats.values(), key=lambda b: b.rank):
        groups.setdefault((beat.phase, beat.step), []).append(beat)
    order = sorted(groups, key=lambda key: min(b.rank for b in groups[key]))
    parts = [([b.rank for b in groups[key]], {b.host for b in groups[key]},
              f"{_PHASE_TEXT.get(key[0], key[0])} at step {key[1]}") for key in order]
    silent = [rank for rank in range(world_size) if rank not in beats]
    if silent:
        parts.append((silent, set(), "never reported (no heartbeat)"))
    text = [_group_text(*part) for part in parts[:SUMMARY_GROUPS]]
    rest = parts[SUMMARY_GROUPS:]
    if rest:
        text.append(f"{len(rest)} more groups ({sum(len(part[0]) for part in rest)} ranks)")
    return "; ".join(text)


def suspects(beats: dict[int, Beat], world_size: int) -> tuple[str, ...]:
    """Hosts whose ranks all fell behind the others in a training step or in start-up: a node fault, not the
    script's own hang. Empty when every rank stopped at the same step, or a laggard shares its host with a rank
    that kept up, or the laggards sit in validation or a checkpoint save (the script's collectives)."""
    if len(beats) < world_size or not beats:
        return ()  # ranks that never reported have no known host: nothing to exclude
    front = max(beat.step for beat in beats.values())
    behind = [b for b in beats.values() if b.step < front]
    if not behind or any(b.phase not in (heartbeat.START, heartbeat.TRAINING) for b in behind):
        return ()
    kept_up = {b.host for b in beats.values() if b.step == front}
    hosts = {b.host for b in behind}
    return () if hosts & kept_up else tuple(sorted(hosts))


def heartbeat_seconds(limits: Limits | None) -> float:
    """How often a rank may rewrite its heartbeat within a phase: a tenth of the stall timeout (0.5-30 s)."""
    return min(max(limits.stall / 10, 0.5), 30.0) if limits else 30.0
