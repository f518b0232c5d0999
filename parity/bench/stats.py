"""From every rank's recorded windows to the figures of one arm at one world size. Pure (no torch).

Reduction across ranks: ranks synchronise every step (the gradient all-reduce), so a window ends when its
slowest rank ends; the world's time of a window is the maximum over ranks. Step time is the median of those
over every synced window of every repeat; the spread is their min and max, and the spread over ranks is the
range of each rank's own median divided by the median.
"""

from __future__ import annotations

import statistics

from sprite.parity.bench.settings import LAUNCH_BOUND_RATIO, BenchSettings


def _per_step(window: dict) -> float:
    return window["seconds"] / window["steps"]


def world_times(launches: list[list[dict]], mode: str) -> list[float]:
    """Seconds per step of every ``mode`` window of every launch, each the slowest rank's."""
    times = []
    for ranks in launches:
        for index, window in enumerate(ranks[0]["windows"]):
            if window["mode"] == mode:
                times.append(max(_per_step(rank["windows"][index]) for rank in ranks))
    return times


def _spread(values: list[float]) -> dict | None:
    if not values:
        return None
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def _rank_spread(launches: list[list[dict]]) -> dict:
    medians = []
    for rank in range(len(launches[0])):
        own = [_per_step(w) for ranks in launches for w in ranks[rank]["windows"] if w["mode"] == "sync"]
        medians.append(statistics.median(own))
    middle = statistics.median(medians)
    return {"medians": medians, "relative_range": (max(medians) - min(medians)) / middle if middle else None}


def _data_share(launches: list[list[dict]]) -> float:
    shares = []
    for ranks in launches:
        for rank in ranks:
            synced = [w for w in rank["windows"] if w["mode"] == "sync"]
            shares.append(sum(w["loader_seconds"] for w in synced) / sum(w["seconds"] for w in synced))
    return statistics.median(shares)


def _memory(launches: list[list[dict]]) -> dict | None:
    seen = [rank["memory"] for ranks in launches for rank in ranks if rank.get("memory")]
    if not seen:
        return None
    return {key: max(m[key] for m in seen) for key in ("allocated", "reserved")}


def peak_of(records: list[dict]) -> dict:
    """The peak MFU is computed against: the measured GEMM rate (median over ranks) if any, else the table's."""
    measured = [r["measured_peak"]["tflops"] for r in records if r.get("measured_peak")]
    if measured:
        return {"tflops": statistics.median(measured), "source": records[0]["measured_peak"]["source"]}
    return dict(records[0]["table_peak"])


def arm_figures(launches: list[list[dict]], settings: BenchSettings, world: int, repeats: list[int]) -> dict:
    """Every figure of one arm at ``world`` from its launches (one list of rank records per repeat in
    ``repeats``)."""
    step = _spread(world_times(launches, "sync"))
    nosync = _spread(world_times(launches, "nosync"))
    probe = _spread(world_times(launches, "probe"))
    step_s = step["median"]
    tokens_s = settings.tokens_per_step(world) / step_s
    records = launches[0]
    flops = [r["flops_per_step"] for r in records if r["flops_per_step"] is not None]
    tflops = statistics.mean(flops) / step_s / 1e12 if flops else None
    peak = peak_of(records)
    figures = {
        "step_s": step, "repeats": list(repeats),
        "per_launch_step_s": [statistics.median(world_times([ranks], "sync")) for ranks in launches],
        "ranks": _rank_spread(launches), "tokens_per_step": settings.tokens_per_step(world),
        "tokens_per_s": tokens_s, "tokens_per_s_per_device": tokens_s / world,
        "flops_per_step": sum(flops) if flops else None, "tflops_per_device": tflops, "peak": peak,
        "mfu": tflops / peak["tflops"] if tflops and peak["tflops"] else None,
        "memory": _memory(launches), "data_share": _data_share(launches),
        "device_names": sorted({r["device_name"] for r in records}),
        "device_types": sorted({r["device"].split(":")[0] for r in records}),
        "nosync_step_s": nosync, "comm_s": step_s - nosync["median"] if nosync else None,
        "probe": None,
    }
    if probe:
        ratio = probe["median"] / step_s
        figures["probe"] = {"batch": 2 * settings.batch, "step_s": probe["median"], "ratio": ratio,
                            "launch_bound": ratio < LAUNCH_BOUND_RATIO}
    return figures


def ratio(sprite: dict, base: dict) -> dict:
    """sprite's step time over a baseline's: of the medians, and the range over the repeats both arms ran
    (paired by repeat: launched next to each other)."""
    own = dict(zip(sprite["repeats"], sprite["per_launch_step_s"]))
    other = dict(zip(base["repeats"], base["per_launch_step_s"]))
    pairs = [own[r] / other[r] for r in own if r in other]
    return {"median": sprite["step_s"]["median"] / base["step_s"]["median"],
            "min": min(pairs) if pairs else None, "max": max(pairs) if pairs else None, "pairs": len(pairs)}


def efficiency(points: list[dict], arm: str = "sprite") -> dict[int, float]:
    """Weak-scaling efficiency of ``arm`` per world size against the smallest world measured: the per-rank batch
    is fixed, so ideal is an unchanged step time, and efficiency = step(W0) / step(W)
    = tokens/s(W) / (W / W0 x tokens/s(W0))."""
    measured = [p for p in points if arm in p["arms"]]
    if not measured:
        return {}
    base = min(measured, key=lambda p: p["world"])
    first = base["arms"][arm]["step_s"]["median"]
    return {p["world"]: first / p["arms"][arm]["step_s"]["median"] for p in measured}
