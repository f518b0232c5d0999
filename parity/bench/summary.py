"""The sentences of a benchmark report: the verdict and summary a person reads first, and how it was measured.

Pure: reads the report's figures only.
"""

from __future__ import annotations

from sprite.parity.bench.settings import LAUNCH_BOUND_RATIO, BenchSettings


def method(settings: BenchSettings) -> dict:
    """How each figure was measured, in words (kept in bench.json next to the figures)."""
    if settings.window == 1:
        timing = "every step timed between two device synchronisations (--window 1)"
    else:
        timing = (f"windows of {settings.window} steps timed between two device synchronisations, none inside a "
                  "window (a per-step synchronisation added ~15% to a launch-bound H200 step)")
    return {
        "timing": f"{timing}, after {settings.warmup} warm-up steps; {settings.steps} timed steps per launch x "
                  f"{settings.repeats} repeat(s); synchronise = the runtime device table's synchronize",
        "reduction": "a window's time is its slowest rank's; step time = median over windows (min, max shown); "
                     "spread over ranks = range of the ranks' own medians / median",
        "communication": "synced step time minus the same step without gradient synchronisation (DDP no_sync "
                         "flag, FSDP2 set_requires_gradient_sync(False)), windows alternating in the same processes",
        "flops": "torch.utils.flop_counter.FlopCounterMode over warm-up step 0 on every rank, eager (before any "
                 "torch.compile); fused attention counted as eager attention",
        "tokens": "tokens per step = batch x seq x world (batch is per rank)",
        "launch_bound": f"one window at twice the batch in sprite's arm at the smallest world, after its own "
                        f"{settings.warmup} warm-up steps; launch-bound if its step time grows by less than "
                        f"x{LAUNCH_BOUND_RATIO}",
    }


def _seconds(value: float) -> str:
    return f"{value * 1000:.1f} ms" if value < 1 else f"{value:.3f} s"


def _point_line(point: dict, baselines: tuple[str, ...]) -> str | None:
    sprite = point["arms"].get("sprite")
    if sprite is None:
        return None
    device = ", ".join(sprite["device_names"])
    line = f"world {point['world']} ({device}): sprite {_seconds(sprite['step_s']['median'])} a step"
    names = {"raw": "the raw PyTorch loop", "lightning": "Lightning under torchrun"}
    for base in baselines:
        found = point["ratios"].get(base)
        if found:
            pairs = found["pairs"]
            spread = f", {found['min']:.3f}-{found['max']:.3f} over {pairs} pairs" if pairs > 1 else ""
            line += (f", {found['median']:.3f}x {names[base]} "
                     f"({_seconds(point['arms'][base]['step_s']['median'])}{spread})")
        else:
            line += f", no ratio against {names[base]} (that arm has no result)"
    return line


def _mfu_line(point: dict) -> str:
    sprite = point["arms"]["sprite"]
    peak = sprite["peak"]
    if sprite["mfu"] is None:
        why = peak["source"] if peak["tflops"] is None else "no FLOPs were counted"
        return f"MFU not reported: {why}"
    return (f"MFU {sprite['mfu']:.1%} at world {point['world']}: {sprite['tflops_per_device']:.3g} TFLOP/s per "
            f"device against {peak['tflops']:.4g} ({peak['source']})")


def _probe_line(point: dict) -> str | None:
    probe = point["arms"]["sprite"].get("probe")
    if not probe:
        return None
    if probe["launch_bound"]:
        return (f"launch-bound at world {point['world']}: doubling the batch to {probe['batch']} changed the step "
                f"time by x{probe['ratio']:.2f} (< x{LAUNCH_BOUND_RATIO}); kernels are too small to fill the "
                "device: a larger batch is nearly free, and --compile measures what fusing kernels buys")
    return (f"not launch-bound at world {point['world']}: doubling the batch to {probe['batch']} changed the step "
            f"time by x{probe['ratio']:.2f}")


def _scaling_lines(points: list[dict]) -> list[str]:
    lines = []
    for point in points:
        sprite = point["arms"].get("sprite")
        if sprite is None or point["world"] == min(p["world"] for p in points):
            continue
        comm = sprite["comm_s"]
        share = f" ({comm / sprite['step_s']['median']:.0%} of the step)" if comm is not None else ""
        lines.append(f"world {point['world']}: scaling efficiency {point['efficiency']:.0%} of ideal, "
                     f"communication {_seconds(comm) if comm is not None else 'not measured'} a step{share}")
    return lines


def _mismatch_lines(point: dict) -> list[str]:
    sprite = point["arms"].get("sprite")
    lines = []
    for arm, figures in point["arms"].items():
        if sprite and arm != "sprite" and figures["device_types"] != sprite["device_types"]:
            lines.append(f"WARNING world {point['world']}: {arm} ran on {'/'.join(figures['device_types'])} but "
                         f"sprite on {'/'.join(sprite['device_types'])}; that ratio compares different devices")
    return lines


def lines(report: dict, settings: BenchSettings) -> list[str]:
    """Verdict first, then one line per finding."""
    failed, total = len(report["failures"]), len(report["launches"])
    out = [f"verdict: {'all' if not failed else total - failed} of {total} launches measured"
           + (f"; {failed} FAILED (see the logs below)" if failed else "")]
    for point in report["points"]:
        out += [line for line in (_point_line(point, settings.baselines),) if line] + _mismatch_lines(point)
    measured = [p for p in report["points"] if "sprite" in p["arms"]]
    if measured:
        first = min(measured, key=lambda p: p["world"])
        out += [_mfu_line(first)] + [line for line in (_probe_line(first),) if line]
    out += _scaling_lines(measured)
    out += [f"FAILED: {f['what']} (log: {f['log']})" for f in report["failures"]]
    return out
