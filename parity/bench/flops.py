"""Model FLOPs of one training step, counted by ``torch.utils.flop_counter.FlopCounterMode`` on what runs.

The counter sees the matrix multiplies that actually execute, so a frozen weight (LoRA's backbone) costs no
weight-gradient multiply in backward, unlike the 6 x parameters x tokens rule of thumb. torch registers
formulas only for the CUDA attention kernels; fused attention on CPU (``..._for_cpu``) and on XPU
(``..._overrideable``) would count as zero, so every fused attention kernel gets the formula below (torch
2.13 flop_counter.py lacks them). Attention is counted as model FLOPs, as MFU defines them: the full
(non-causal) score matrix, and in backward without the flash kernels' recomputation of the scores, which makes
fused and eager attention count the same.
"""

from __future__ import annotations

import torch
from torch.utils.flop_counter import FlopCounterMode

_FUSED = ("_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
          "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu",
          "_scaled_dot_product_fused_attention_overrideable")


def attention_forward(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    """scores = Q K^T and out = scores V, each 2 x b x query heads x s_q x s_k x head dim (GQA: key/value heads
    broadcast to the query heads)."""
    batch, heads, s_q, d_q = query_shape
    s_k, d_v = key_shape[2], value_shape[3]
    return 2 * batch * heads * s_q * s_k * (d_q + d_v)


def attention_backward(grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    """dV = P^T dO, dP = dO V^T, dQ = dS K, dK = dS^T Q: twice the forward."""
    return 2 * attention_forward(query_shape, key_shape, value_shape)


def attention_mapping() -> dict:
    """FlopCounterMode ``custom_mapping`` for every fused attention op this torch build has."""
    aten, mapping = torch.ops.aten, {}
    for name in _FUSED:
        for op_name, formula in ((name, attention_forward), (name + "_backward", attention_backward)):
            op = getattr(aten, op_name, None)
            if op is not None:
                mapping[op] = formula
    return mapping


class StepFlops:
    """Counts the FLOPs of everything run between ``start()`` and ``stop()`` on this rank."""

    def __init__(self):
        self.mode: FlopCounterMode | None = None
        self.total: int | None = None
        self.by_op: dict[str, int] = {}

    def start(self) -> None:
        self.mode = FlopCounterMode(display=False, custom_mapping=attention_mapping())
        self.mode.__enter__()

    def stop(self) -> None:
        """Ends counting; ``total`` and ``by_op`` hold the result. Does nothing if counting never started."""
        if self.mode is None:
            return
        self.mode.__exit__(None, None, None)
        counts = self.mode.get_flop_counts().get("Global", {})
        self.by_op = {str(op): int(flops) for op, flops in counts.items()}
        self.total = int(self.mode.get_total_flops())
        self.mode = None


def count(fn) -> int:
    """FLOPs of calling ``fn()`` once (forward, backward, whatever it runs)."""
    flops = StepFlops()
    flops.start()
    try:
        fn()
    finally:
        flops.stop()
    return flops.total
