"""Checks of the options `sprite parity` and `sprite ckpt-check` share, before anything runs. No torch.

Each raises UsageError (exit code 2) naming the option, the usual cause and the fix.
"""

from __future__ import annotations

import importlib.util
import pathlib

from sprite.errors import UsageError


def at_most(*limits: tuple[str, float, float]) -> None:
    """Raises UsageError for the first ``(flag, value, most)`` whose value is over ``most``: a count this large is
    a typo, and would build a launch list or a world that never ends."""
    for flag, value, most in limits:
        if value > most:
            raise UsageError(f"{flag} {value} is more than {most:,}.", "A run this large never ends.",
                             f"Pass {flag} {most:,} or less.")


def check_common(command: str, precision: str, accelerator: str, model: str, precision_cause: str) -> str:
    """Checks --precision, --accelerator, --model and the optional extra; returns the model as the ranks get it
    (a preset name, or the absolute path of a local checkpoint directory)."""
    from sprite.contract import ACCELERATORS
    from sprite.parity.settings import PRECISIONS, PRESETS

    if precision not in PRECISIONS:
        raise UsageError(f"--precision {precision!r} is not supported.", precision_cause,
                         f"Use one of: {', '.join(PRECISIONS)}.")
    if accelerator not in ACCELERATORS:
        raise UsageError(f"--accelerator {accelerator!r} is not supported.",
                         "The arms run only on the device types in sprite's device table.",
                         f"Use one of: {', '.join(ACCELERATORS)}.")
    missing = [name for name in ("peft", "transformers") if importlib.util.find_spec(name) is None]
    if missing:
        raise UsageError(f"sprite {command} needs {' and '.join(missing)}, which {'is' if len(missing) == 1 else 'are'}"
                         " not installed here.", "They are an optional extra of sprite (the LoRA recipe).",
                         "pip install 'sprite-hpc[parity]' (or peft and transformers), then run again.")
    if model not in PRESETS and not (pathlib.Path(model) / "config.json").is_file():
        raise UsageError(f"--model {model!r} is neither a preset nor a checkpoint directory.",
                         "Hub ids are not fetched (the hub is never contacted).",
                         f"Pass {', '.join(PRESETS)} or a local directory holding config.json.")
    return model if model in PRESETS else str(pathlib.Path(model).resolve())
