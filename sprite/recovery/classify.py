"""How an attempt ended, from its exit code and log text alone (a pure function; tested on recorded logs).

A dying rank takes the others down with it, so a log holds one first failure and many echoes (peers losing their
connection, launchers killing the rest). The rules look for the first failure's kind of evidence in order:
exit code 75 (the ranks stopped for preemption, sprite/runtime/preempt.py), sprite's own lines (a forwarded
signal, a stall, a refused launch), then memory exhaustion, then the scheduler or device saying a node failed,
then a Python exception that is not a lost connection (the script's own fault), then a rank killed by SIGKILL or
SIGBUS with no such exception (a node fault: the host or the kernel killed it), then an abort or a segmentation
fault (the application), then lost connections alone (a peer or its node vanished).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

from sprite.errors import EXIT_PREEMPTED

SUCCESS, NODE_FAULT, APP_FAULT, STALL = "success", "node fault", "application fault", "stall"
PREEMPTION, INTERRUPTED, USAGE, CHECK_FAILED = "preemption", "interrupted", "bad usage", "check failed"
CAUSES = (SUCCESS, NODE_FAULT, APP_FAULT, STALL, PREEMPTION, INTERRUPTED, USAGE, CHECK_FAILED)
_NODE_SIGNALS = {9: "SIGKILL", 7: "SIGBUS"}


@dataclass(frozen=True)
class Verdict:
    """The cause (one of CAUSES), the evidence as one line, and the hosts it blames (node faults, stalls)."""

    cause: str
    reason: str
    hosts: tuple[str, ...] = ()


_FORWARDED = re.compile(r"sprite: received (SIG\w+); passing it to the launcher")
_STALLED = re.compile(r"sprite: error: (Stopped the run: no rank advanced.*)$", re.M)
# The suspect hosts of a stall line, only when listed whole (a cut list ends "and N more"): a fallback for a log
# read without the watcher's Stall, whose own hosts attempt.py passes in.
_SUSPECTS = re.compile(r"suspect hosts: ([\w.-]+(?:,[\w.-]+)*)\)")

_ALLOCATION_END = re.compile(r"DUE TO PREEMPTION|DUE TO TIME LIMIT|PBS: job killed: walltime \S+ exceeded limit")
_OOM = re.compile(r"can't allocate memory|oom[-_]kill|CUDA out of memory|OutOfMemoryError|OUT_OF_DEVICE_MEMORY")
_NODE_FAILURE = re.compile(r"Node failure on (?P<host>[\w.-]+)|ON (?P<on>[\w.-]+) CANCELLED AT \S+ DUE TO NODE "
                           r"FAILURE|NODE_FAIL|uncorrectable ECC|Xid \d+|DEVICE_LOST|GPU is lost|Bus error")
# The label a launcher puts before each line of a rank (sprite.launch.rank_output.LABELS): the local supervisor's
# "[rank N] ", Hydra's "[N] ", srun's (and, taken to be the same, PALS's) "N: ", Open MPI's "[job,N]<stderr>:".
_LABEL = (r"(?:\[rank (?P<rank>\d+)\] |\[(?P<hydra>\d+)\] | *(?P<label>\d+): "
          r"|\[[^\],\s]+,(?P<ompi>\d+)\]<std\w+>: ?)?")
# An exception line, after the launcher's label and torch's own "[rankN]: ".
_EXCEPTION = re.compile(r"^" + _LABEL + r"(?:\[rank\d+\]: )?"
                        r"(?P<line>(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception)(?::.*)?)$", re.M)
_SPRITE_ERROR = re.compile(r"^" + _LABEL + r"sprite: error: (?P<said>.*)$", re.M)  # a rank's refusal (errors.report)
_LOST_PEER = re.compile(r"Connection (?:refused|reset by peer|closed by peer)|failed to connect|ncclRemoteError|"
                        r"ncclSystemError|Socket Timeout|remote process exited|DistNetworkError|DistBackendError")
_LAUNCHER_ECHO = re.compile(r"ChildFailedError")  # torchrun's agent restating a rank's failure
# A rank that died of a signal, as each launcher reports it; the groups say which rank, host and signal.
_DEATHS = (
    re.compile(r"sprite: rank (?P<rank>\d+) exited with code -(?P<sig>\d+)"),  # sprite's local supervisor
    re.compile(r"PID \d+ RUNNING AT (?P<host>[\w.-]+)\s*\n=\s+EXIT CODE: \d+[\s\S]*?EXIT STRING: .*\(signal "
               r"(?P<sig>\d+)\)"),  # MPICH Hydra
    re.compile(r"srun: error: (?P<host>[\w.-]+): tasks? (?P<rank>\d+)[\d,-]*: (?P<name>Killed|Bus error)"),
    re.compile(r"Root Cause \(first observed failure\):\s*\n\[\d+\]:\s*\n.*\n\s*host\s*: (?P<host>[\w.-]+)\s*\n"
               r"\s*rank\s*: (?P<rank>\d+).*\n\s*exitcode\s*: -(?P<sig>\d+)"),  # torchrun's summary
)
_ABORT = re.compile(r"terminate called|Segmentation fault|Aborted|exited with code -(?:6|11)\b|\(signal (?:6|11)\)")


def _death(log: str, rank_hosts: Sequence[str]) -> tuple[str, tuple[str, ...]] | None:
    for pattern in _DEATHS:
        for match in pattern.finditer(log):
            found = match.groupdict()
            sig = int(found["sig"]) if found.get("sig") else (9 if found.get("name") == "Killed" else 7)
            if sig not in _NODE_SIGNALS:
                continue
            rank = int(found["rank"]) if found.get("rank") else None
            host = found.get("host") or (rank_hosts[rank] if rank is not None and rank < len(rank_hosts) else "")
            who = f"rank {rank}" if rank is not None else "a rank"
            return (f"{who}{' on ' + host if host else ''} was killed by {_NODE_SIGNALS[sig]} without an exception "
                    "of its own"), ((host,) if host else ())
    return None


def _first_exception(log: str) -> str | None:
    for match in _EXCEPTION.finditer(log):
        if not _LOST_PEER.search(match["line"]) and not _LAUNCHER_ECHO.search(match["line"]):
            number = next((match[key] for key in ("rank", "hydra", "label", "ompi") if match[key]), None)
            rank = f"rank {number}: " if number else ""
            return rank + match["line"].strip()[:300]
    return None


def _stall_reason(line: str) -> str:
    """A stall line's first sentence (what stopped) and where the ranks were, within 300 characters: the line gives
    its cause and fix between them, which an attempt's reason does not need."""
    first = line.split(". ", 1)[0]
    where = line.rpartition("Where the ranks were: ")[2] if "Where the ranks were: " in line else ""
    reason = f"{first}; {where}" if where else first
    return reason if len(reason) <= 300 else reason[:299] + "…"


def _sprite_verdict(code: int, log: str, suspects: tuple[str, ...] | None) -> Verdict | None:
    forwarded = _FORWARDED.findall(log)
    if forwarded:
        cause = INTERRUPTED if forwarded[0] == "SIGINT" else PREEMPTION
        return Verdict(cause, f"sprite received {forwarded[0]} and passed it to the launch")
    stalled = _STALLED.search(log)
    if code == 124 and stalled:
        if suspects is None:
            listed = _SUSPECTS.search(stalled.group(1))
            suspects = tuple(listed.group(1).split(",")) if listed else ()
        return Verdict(STALL, _stall_reason(stalled.group(1)), tuple(suspects))
    refused = _refusal(log)
    if code in (1, 2) and refused:
        return Verdict(USAGE if code == 2 else CHECK_FAILED, refused)
    return None


def _refusal(log: str) -> str | None:
    """The first "sprite: error:" line of a rank. A rank's echo of a peer that vanished ("sprite: error: ...
    Connection closed by peer", from a background save's outcome) is not sprite's refusal: the peer's own failure,
    found further on, is the cause."""
    refused = next((m for m in _SPRITE_ERROR.finditer(log) if not _LOST_PEER.search(m["said"])), None)
    return refused["said"].strip()[:300] if refused else None


def failed_in_preemption(ranks: Sequence[int], log: str) -> Verdict:
    """The Verdict when the launcher's code says preemption (75) but ``ranks`` wrote a failed heartbeat: srun
    returns the highest code of its tasks, so one rank's failure in the preemption save (a full disk) hides behind
    the others' 75. The failing rank's own refusal (a check failed: no relaunch) or exception is the cause."""
    who = f"rank{'s' if len(ranks) > 1 else ''} {','.join(map(str, ranks))} failed while the others stopped for " \
          "preemption"
    refused = _refusal(log)
    if refused:
        return Verdict(CHECK_FAILED, f"{who}: {refused}"[:300])
    exception = _first_exception(log)
    return Verdict(APP_FAULT, f"{who}: {exception}"[:300] if exception else who)


def classify(code: int, log: str, rank_hosts: Sequence[str] = (),
             suspects: Sequence[str] | None = None) -> Verdict:
    """The Verdict for an attempt that ended with ``code`` (128+N for signal N) and wrote ``log``.

    ``rank_hosts[r]`` is the host of rank r, to name the host of a rank the log names only by number.
    ``suspects``: the hosts the watchdog blamed when it stopped the run for a stall (its Stall's), taken over the
    stall line in the log, which a large world's line may have cut; None: read them from that line.
    """
    failed = _NODE_FAILURE.search(log)
    if code == 0 and not failed:
        return Verdict(SUCCESS, "every rank finished")
    if code == EXIT_PREEMPTED:
        return Verdict(PREEMPTION, f"the ranks saved a checkpoint on the preemption signal and stopped (exit {code})")
    found = _sprite_verdict(code, log, None if suspects is None else tuple(suspects))
    if found:
        return found
    ending = _ALLOCATION_END.search(log)
    if ending:
        return Verdict(PREEMPTION, f"the scheduler ended the allocation ({ending.group(0)})")
    oom = _OOM.search(log)
    if oom:
        return Verdict(APP_FAULT, f"out of memory ({oom.group(0)})")
    if failed:  # srun exits 0 after "Node failure on HOST" (seen here, Slurm 22.05)
        host = failed.group("host") or failed.group("on")
        return Verdict(NODE_FAULT, f"the log reports a node failure ({failed.group(0)})", (host,) if host else ())
    exception = _first_exception(log)
    if exception:
        return Verdict(APP_FAULT, exception)
    death = _death(log, rank_hosts)
    if death:
        return Verdict(NODE_FAULT, *death)
    aborted = _ABORT.search(log)
    if aborted:
        return Verdict(APP_FAULT, f"a rank aborted ({aborted.group(0)})")
    lost = _LOST_PEER.search(log)
    if lost:
        return Verdict(NODE_FAULT, f"a rank lost its peers ({lost.group(0)}) with no other failure in the log")
    if code - 128 in _NODE_SIGNALS:
        return Verdict(NODE_FAULT, f"the launch was killed by {_NODE_SIGNALS[code - 128]}")
    return Verdict(APP_FAULT, f"exit code {code} with no recognised cause in the log")
