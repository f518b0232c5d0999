"""The peak a step's FLOP rate is measured against (MFU): a table of dense bf16 peaks by device name, each with
its source, or with ``--measure-peak`` a large GEMM timed on the device itself.

The table holds dense (no sparsity) bf16 tensor-core peaks only, so MFU from the table is reported only for
bf16 steps (bf16-mixed, bf16-true); an unknown device or another precision gets a reason instead of a number.
Importing this module does not import torch.
"""

from __future__ import annotations

import dataclasses
import time

# Intel Max 1550 per tile (stack): each Xe core has 8 XMX matrix engines of 512 bf16 FLOP per clock, i.e. 512 FLOP
# per clock per EU (vector engine), at the 1.6 GHz peak clock (Intel ark 232873: 128 Xe cores, 1024 XMX engines,
# 1.6 GHz for the two-tile card, 839 TFLOP/s bf16).
XE_BF16_FLOP_PER_EU_CLOCK = 512
MAX_1550_CLOCK_HZ = 1.6e9
MAX_1550_TILE_EUS = 512


@dataclasses.dataclass(frozen=True)
class Peak:
    """``tflops`` per device (None when unknown, then ``source`` says why)."""

    tflops: float | None
    source: str


def _nvidia(name: str) -> Peak | None:
    lower = name.lower()
    if "h200" in lower and "nvl" not in lower:
        return Peak(989.0, "NVIDIA H200 datasheet, SXM: 1,979 TFLOP/s bf16 with sparsity, 989 dense")
    if "h100" in lower and ("sxm" in lower or "hbm3" in lower):
        return Peak(989.0, "NVIDIA H100 datasheet, SXM5: 1,979 TFLOP/s bf16 with sparsity, 989 dense")
    if "a100" in lower:
        return Peak(312.0, "NVIDIA A100 datasheet: 312 TFLOP/s bf16 dense (624 with sparsity)")
    return None


def _intel(name: str, compute_units: int | None) -> Peak | None:
    if "max 1550" not in name.lower():
        return None
    eus = compute_units or MAX_1550_TILE_EUS
    tflops = eus * XE_BF16_FLOP_PER_EU_CLOCK * MAX_1550_CLOCK_HZ / 1e12
    told = "as the driver reports" if compute_units else "the card's count, the driver reported none"
    return Peak(tflops, f"Intel Max 1550 per tile: {eus} EUs ({told}) x {XE_BF16_FLOP_PER_EU_CLOCK} bf16 FLOP/clock"
                        f" (XMX) x {MAX_1550_CLOCK_HZ / 1e9:.1f} GHz peak clock (Intel ark 232873)")


def table_peak(name: str, precision: str, compute_units: int | None = None) -> Peak:
    """The table's peak for a device called ``name`` running ``precision``, or a Peak(None, reason)."""
    if not precision.startswith("bf16"):
        return Peak(None, f"the peak table holds bf16 peaks only and this step runs {precision}; "
                          "pass --measure-peak to time a GEMM in the step's dtype")
    found = _nvidia(name) or _intel(name, compute_units)
    if found is None:
        return Peak(None, f"no peak for {name!r} in sprite's table (H100/H200 SXM, A100, Intel Max 1550); "
                          "pass --measure-peak to time a GEMM instead")
    return found


def gemm_size(device_type: str) -> int:
    """Square GEMM size for --measure-peak: large enough to saturate an accelerator, small on a CPU."""
    return 512 if device_type == "cpu" else 8192


def measure_peak(kind, device, precision: str, repeats: int = 10) -> tuple[float, str]:
    """Times ``repeats`` n x n GEMMs in the step's dtype between two synchronisations through the device table
    row ``kind``; returns (TFLOP/s, description)."""
    import torch

    dtype = torch.bfloat16 if precision.startswith("bf16") else torch.float32
    n = gemm_size(device.type)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(3):  # warm-up: kernel selection, clocks
        a @ b
    kind.synchronize(device)
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    kind.synchronize(device)
    seconds = time.perf_counter() - start
    tflops = 2 * n**3 * repeats / seconds / 1e12
    return tflops, f"measured: {repeats} {n}x{n} {str(dtype).replace('torch.', '')} GEMMs, {tflops:.3g} TFLOP/s"
