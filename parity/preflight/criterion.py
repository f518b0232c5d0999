"""The verdict of `sprite preflight`: pure functions over what the ranks recorded (numbers and digests), one
verdict per node. No torch; nothing here runs or reads anything.

A node fails a check when one of its ranks does:

* ``reported``: the rank wrote nothing (it never started, or died before its first record);
* ``devices``: it saw fewer devices than the site profile promises;
* ``result``: its reference computation raised, an exact stage differs from the known answer, a stage differs
  from the golden digest known for its device kind and torch version, or a stage differs from the majority of
  the ranks of its device kind (ranks already known wrong do not vote; with no majority every rank of the tie
  fails, since none can be trusted);
* ``slow``: its fastest repetition (of both timed windows) took more than ``slow_factor`` times the median of the
  other ranks of its kind;
* ``collective``: its own rendezvous failed (not by waiting out its timeout: a port taken, an address that does not
  resolve); it never finished its all-reduces after some rank got past the rendezvous (sprite stopped the launch
  while it hung); or a collective failed while every rank of the world reported and joined (a link, not a peer, is
  at fault). A timeout caused by a silent peer, and a rank silent in a rendezvous some rank failed, are noted, not
  failed.

Some launches name no node (``launch_problem``): no rank wrote a record (the launch failed as a whole), or every
rank started and none got past the rendezvous nor failed it by itself (nothing tells which node kept the others
waiting). Such a preflight is inconclusive, and no node in it is ok.
"""

from __future__ import annotations

import bisect
import functools
import hashlib
from collections import Counter, defaultdict

import numpy as np

CHECKS = ("reported", "devices", "result", "slow", "collective")
EXACT_INNER = 64  # as reference.EXACT_INNER (that module imports torch)
# Golden digests of the random stages, by (device name, torch version): {stage: sha256}. Measured on a node known
# good (`sprite preflight --json` prints every rank's digests); none is recorded yet for the machines sprite is
# tested on, so the ranks of a kind are compared with each other.
GOLDEN: dict[tuple[str, str], dict[str, str]] = {}


def exact_answer(rows: int) -> np.ndarray:
    """The exact stage's product, as reference.exact_inputs builds it, in int64."""
    i = np.arange(rows)[:, None]
    k = np.arange(EXACT_INNER)
    a = (i * 7 + k * 3) % 5 - 2
    j = np.arange(rows)
    b = (k[:, None] * 3 + j * 11 + k[:, None] * j) % 5 - 2
    return a @ b


@functools.lru_cache(maxsize=None)  # one product per precision and size, whatever the world size
def exact_digest(precision: str, rows: int) -> str:
    """sha256 of the exact product's bytes in ``precision``: every value is an integer of magnitude <= 256, so
    fp32, fp16 and bf16 (the upper half of the fp32 bits) hold it exactly on any device."""
    values = exact_answer(rows).astype(np.float32)
    if precision == "bf16":
        data = (values.view(np.uint32) >> 16).astype("<u2").tobytes()
    elif precision == "fp16":
        data = values.astype("<f2").tobytes()
    else:
        data = values.astype("<f4").tobytes()
    return hashlib.sha256(data).hexdigest()


def _kind(record: dict) -> tuple:
    return record.get("accelerator"), record.get("device_name"), record.get("torch")


def result_problems(computed: dict[int, dict], size: int, golden: dict = GOLDEN) -> dict[int, list[str]]:
    """Per rank, what is wrong with its reference computation (see the module docstring)."""
    problems: dict[int, list[str]] = defaultdict(list)
    for rank, record in computed.items():
        if record.get("error"):
            problems[rank].append(f"the reference computation failed: {record['error']}")
            continue
        known = golden.get(_kind(record)[1:], {})
        for stage, found in sorted(record.get("digests", {}).items()):
            if stage.startswith("exact-") and found != exact_digest(stage.split("-", 1)[1], size):
                problems[rank].append(f"{stage} differs from the known exact answer")
            elif stage in known and found != known[stage]:
                problems[rank].append(f"{stage} differs from the golden digest of {_kind(record)[1]}")
    voters: dict[tuple, list[int]] = defaultdict(list)
    for rank, record in computed.items():
        if rank not in problems:
            voters[_kind(record)].append(rank)
    for kind, ranks in voters.items():
        stages = sorted({s for r in ranks for s in computed[r]["digests"] if not s.startswith("exact-")})
        for stage in stages:
            votes = Counter(computed[r]["digests"].get(stage) for r in ranks)
            top, count = votes.most_common(1)[0]
            majority = top if count * 2 > len(ranks) else None
            for rank in ranks:
                mine = computed[rank]["digests"].get(stage)
                if majority is None:
                    problems[rank].append(f"{stage}: no majority among the {len(ranks)} ranks of its kind")
                elif mine != majority:
                    problems[rank].append(f"{stage} differs from {count} of the {len(ranks)} ranks of its kind")
    return dict(problems)


def median_without(ordered: list[float], value: float) -> float:
    """The median of the sorted list ``ordered`` less one occurrence of ``value`` (O(log n), not a copy)."""
    at = bisect.bisect_left(ordered, value)
    left = len(ordered) - 1

    def rest(k: int) -> float:
        return ordered[k] if k < at else ordered[k + 1]

    mid = left // 2
    return rest(mid) if left % 2 else (rest(mid - 1) + rest(mid)) / 2


def slow_problems(computed: dict[int, dict], factor: float) -> dict[int, list[str]]:
    """Ranks whose compute time exceeds ``factor`` times the median of the other ranks of the same kind."""
    groups: dict[tuple, dict[int, float]] = defaultdict(dict)
    for rank, record in computed.items():
        if isinstance(record.get("seconds"), (int, float)):
            groups[_kind(record)][rank] = float(record["seconds"])
    problems = {}
    for times in groups.values():
        ordered = sorted(times.values())
        for rank, seconds in times.items() if len(ordered) > 1 else ():
            median = median_without(ordered, seconds)
            if seconds > factor * median:
                problems[rank] = [f"{seconds:.3f} s, {seconds / median:.1f}x the median of the other "
                                  f"{len(ordered) - 1} rank(s) (limit {factor:g}x)"]
    return problems


def promised(record: dict, expected: int) -> int:
    """Devices a rank must see: the site's promise for a GPU rank, one for a CPU rank."""
    return 1 if record.get("accelerator") == "cpu" else expected


def device_problems(computed: dict[int, dict], expected: int) -> dict[int, list[str]]:
    return {rank: [f"sees {record['devices_seen']} device(s); the site profile promises {promised(record, expected)}"]
            for rank, record in computed.items() if record.get("devices_seen", 0) < promised(record, expected)}


HUNG = "never finished its all-reduces (it hangs, or still waited on a peer that does when the launch was stopped)"
UNJOINED = "never got past the rendezvous, which no rank got past"
STEPS = (("rendezvous", "the rendezvous"), ("node_allreduce", "the node's all-reduce"),
         ("global_allreduce", "the all-reduce over all ranks"))


def joined(record: dict) -> bool:
    """Whether a final record says its rank got past the rendezvous."""
    return bool(record.get("rendezvous", {}).get("ok"))


def own_rendezvous_failure(record: dict) -> bool:
    """Whether a final record says its rank's rendezvous failed by itself: not by waiting out its timeout (the
    worker records ``timed_out``), which only says some peer never came, nor by losing a peer that died under it
    (``peer_lost``: its connection closed)."""
    rendezvous = record.get("rendezvous")
    return (rendezvous is not None and not rendezvous.get("ok") and not rendezvous.get("timed_out")
            and not rendezvous.get("peer_lost"))


def lost_a_peer(record: dict) -> bool:
    """Whether a final record says its rendezvous failed because a peer's connection closed (the peer died)."""
    rendezvous = record.get("rendezvous")
    return rendezvous is not None and not rendezvous.get("ok") and bool(rendezvous.get("peer_lost"))


DIED = "stopped without a record in the rendezvous, where its peers lost their connection to it (it died)"


def collective_problems(computed: dict[int, dict], final: dict[int, dict], world: int
                        ) -> tuple[dict[int, list[str]], dict[int, list[str]]]:
    """(problems, notes) of the collectives. A rank whose own rendezvous failed fails, and the ranks silent then (a
    compute record, no final one) waited in that rendezvous: a note each. Else a silent rank fails as hung when
    some rank got past the rendezvous, as dead when the others lost their connection to a peer in it, and is a note
    when none did (``launch_problem``). A rendezvous that lost a peer is a note. A rendezvous that timed
    out fails its rank when some other rank got past it, else is a note. A failed all-reduce fails its rank only
    when every rank of the world finished and joined (else the absent one is to blame and the failure is a note)."""
    problems: dict[int, list[str]] = defaultdict(list)
    notes: dict[int, list[str]] = defaultdict(list)
    failed_own = sorted(rank for rank, record in final.items() if own_rendezvous_failure(record))
    anyone_joined = any(joined(record) for record in final.values())
    peer_lost = any(lost_a_peer(record) for record in final.values())
    absent = any(rank not in final or not joined(final[rank]) for rank in range(world))
    for rank in range(world):
        if rank in computed and rank not in final:
            if failed_own:
                notes[rank].append(f"stopped in the rendezvous that rank {_ranks(failed_own)} failed")
            elif anyone_joined:
                problems[rank].append(HUNG)
            elif peer_lost:  # the others lost their connection to a peer that died: the silent one is that peer
                problems[rank].append(DIED)
            else:
                notes[rank].append(UNJOINED)
    for rank, record in final.items():
        for step, label in STEPS:
            result = record.get(step)
            if result is None or result.get("ok"):
                continue
            waited = result.get("timed_out") or result.get("peer_lost")
            blamed = (anyone_joined or not waited) if step == "rendezvous" else not absent
            (problems if blamed else notes)[rank].append(f"{label} failed: {result.get('error', 'no detail')}")
            break
    return dict(problems), dict(notes)


def _ranks(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks[:4])) + (f" ... ({len(ranks)} ranks)" if len(ranks) > 4 else "")


def launch_problem(computed: dict[int, dict], final: dict[int, dict], world: int) -> str | None:
    """Why the records name no node for the launch as a whole, or None: no rank wrote a record (the launcher, the
    environment or the interpreter failed everywhere), or every rank started and none got past the rendezvous nor
    failed it by itself (a rank that crashed in it, an unreachable rendezvous address: nothing names the node)."""
    if not computed and not final:
        return "no rank wrote a record"
    silent = any(rank in computed and rank not in final for rank in range(world))
    decided = any(joined(record) or own_rendezvous_failure(record) or (silent and lost_a_peer(record))
                  for record in final.values())
    if all(rank in computed for rank in range(world)) and not decided:
        return "every rank started, and none got past the rendezvous nor failed it by itself"
    return None


def judge(hosts: tuple[str, ...], per_node: int, computed: dict[int, dict], final: dict[int, dict],
          expected_devices: int, slow_factor: float, size: int, golden: dict = GOLDEN) -> list[dict]:
    """One verdict per node, in node order: host, ok, failed checks with their reasons (rank-prefixed), notes,
    compute time (the node's slowest rank) and the all-reduces' bus bandwidth (the node's lowest). No node is ok
    when ``launch_problem`` finds one; when no rank wrote anything, none is named either."""
    world = len(hosts) * per_node
    timed = fastest(computed, final)
    found = {
        "reported": {r: ["wrote no record (never started, or died first)"] for r in range(world)
                     if r not in computed and (computed or final)},
        "devices": device_problems(computed, expected_devices),
        "result": result_problems(computed, size, golden),
        "slow": slow_problems(timed, slow_factor),
    }
    found["collective"], notes = collective_problems(computed, final, world)
    judged = launch_problem(computed, final, world) is None
    return [_node(node, host, range(node * per_node, (node + 1) * per_node), found, notes, timed, final, judged)
            for node, host in enumerate(hosts)]


def fastest(computed: dict[int, dict], final: dict[int, dict]) -> dict[int, dict]:
    """The compute records with ``seconds`` the faster of a rank's two timed windows: before the rendezvous, and
    after the all-reduces when the rank got that far (``seconds_again``; every rank had started by then, so other
    ranks' start-up no longer shared its cores)."""
    out = {}
    for rank, record in computed.items():
        again, first = final.get(rank, {}).get("seconds_again"), record.get("seconds")
        numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (again, first))
        out[rank] = {**record, "seconds": min(first, again)} if numbers else record
    return out


def _lowest(values):
    values = [v for v in values if isinstance(v, (int, float))]
    return min(values) if values else None


def _node(node: int, host: str, ranks: range, found: dict, notes: dict, computed: dict, final: dict,
          judged: bool = True) -> dict:
    failed = {check: [f"rank {r}: {why}" for r in ranks for why in found[check].get(r, [])] for check in CHECKS}
    failed = {check: reasons for check, reasons in failed.items() if reasons}
    times = [computed[r]["seconds"] for r in ranks if isinstance(computed.get(r, {}).get("seconds"), (int, float))]
    return {
        "node": node, "host": host, "ok": judged and not failed, "failed": failed,
        "notes": [f"rank {r}: {why}" for r in ranks for why in notes.get(r, [])],
        "compute_seconds": max(times) if times else None,
        "node_busbw_gbps": _lowest(final.get(r, {}).get("node_allreduce", {}).get("busbw_gbps") for r in ranks),
        "global_busbw_gbps": _lowest(final.get(r, {}).get("global_allreduce", {}).get("busbw_gbps") for r in ranks),
    }
