"""``XPUMixedPrecision``: mixed precision that autocasts for the device the run actually uses.

Lightning 2.6.6 picks the autocast device from the accelerator *flag*; for any accelerator given as an instance or
as a name other than "cpu"/"mps" it autocasts for "cuda" (accelerator_connector.py:489), so XPU and
``CPUAccelerator()`` runs silently train in fp32. Passing this plugin in ``plugins=`` skips that branch
(accelerator_connector.py:458-459 returns a given plugin as is). Device-generic despite its public name.
"""

from __future__ import annotations

from typing import Optional, Union

from lightning.pytorch.plugins.precision import HalfPrecision, MixedPrecision, Precision

from sprite.errors import UsageError
from sprite.runtime.devices import device_type

# Lightning's legacy spellings (Lightning 2.x _PRECISION_INPUT) mapped to today's names.
_ALIASES = {"bf16": "bf16-mixed", "16": "16-mixed", 16: "16-mixed", "32": "32-true", 32: "32-true"}
MIXED = ("bf16-mixed", "16-mixed")
PASSTHROUGH = ("32-true", "bf16-true")


def normalize_precision(precision: Union[str, int]) -> str:
    """Today's Lightning name for ``precision`` ("bf16" -> "bf16-mixed", 16 -> "16-mixed", 32 -> "32-true")."""
    return _ALIASES.get(precision, str(precision))


class XPUMixedPrecision(MixedPrecision):
    """Autocast in bf16 or fp16 for ``device`` (xpu, cuda or cpu; default: the first available of those).

    Raises:
        UsageError: ``precision`` is not a mixed precision, or the device type is unknown.
    """

    def __init__(self, precision: Union[str, int] = "bf16-mixed", device: Optional[str] = None, scaler=None):
        name = normalize_precision(precision)
        if name not in MIXED:
            raise UsageError(
                f"XPUMixedPrecision was given precision {precision!r}.",
                "It implements only autocast mixed precision.",
                "Use 'bf16-mixed' or '16-mixed', or precision_plugin() for other precisions.",
            )
        autocast = device_type(device or "auto").autocast
        super().__init__(name, autocast, scaler)


def precision_plugin(precision: Union[str, int], device: Optional[str] = None) -> Precision:
    """The plugin for ``precision`` on ``device``: mixed -> XPUMixedPrecision; 32-true/bf16-true unchanged.

    Raises:
        UsageError: a precision sprite does not handle.
    """
    name = normalize_precision(precision)
    if name in MIXED:
        return XPUMixedPrecision(name, device)
    if name == "32-true":
        return Precision()
    if name == "bf16-true":
        return HalfPrecision("bf16-true")
    raise UsageError(
        f"Precision {precision!r} is not supported by sprite.",
        "sprite fills the precision plugin for mixed, 32-true and bf16-true runs only.",
        "Use one of: bf16-mixed, 16-mixed, 32-true, bf16-true (or the aliases bf16, 16, 32).",
    )
