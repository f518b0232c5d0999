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
    from sprite.parity.settings import PRECISIONS

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
    check_build(accelerator)
    return check_model(model)


CONFIG_BYTES = 10_000_000  # a Hugging Face config.json is a few KB; more is not one


def check_model(model: str) -> str:
    """``model`` as the ranks get it: a preset name, or the absolute path of a local checkpoint folder whose
    config.json is a JSON object naming its ``model_type`` (what transformers' AutoModel builds from). Raises
    UsageError otherwise: the hub is never contacted, and a config the arms cannot build from would fail every
    arm after the run began."""
    import json

    from sprite.parity.settings import PRESETS

    if model in PRESETS:
        return model
    config = pathlib.Path(model) / "config.json"
    if not config.is_file():
        raise UsageError(f"--model {model[:200]!r} is neither a preset nor a checkpoint folder.",
                         "Hub ids are not fetched (the hub is never contacted).",
                         f"Pass {', '.join(PRESETS)} or a local folder holding config.json.")
    try:
        with open(config, "rb") as src:
            text = src.read(CONFIG_BYTES + 1)
        if len(text) > CONFIG_BYTES:
            raise ValueError(f"more than {CONFIG_BYTES:,} bytes")
        found = json.loads(text)
        kind = found.get("model_type") if isinstance(found, dict) else None
    except (OSError, ValueError, RecursionError) as err:
        raise UsageError(f"{str(config)[:200]} cannot be read as JSON ({type(err).__name__}).",
                         "The folder was not written by save_pretrained, or the file is damaged.",
                         "Pass a folder saved with save_pretrained, or a preset.") from None
    if not isinstance(kind, str) or not kind:
        raise UsageError(f"{str(config)[:200]} names no model_type.",
                         "transformers builds a model from its config's model_type; this folder was not written by "
                         "save_pretrained, or its config was cut short.",
                         "Pass a folder saved with save_pretrained, or a preset.")
    return str(pathlib.Path(model).resolve())


def check_build(accelerator: str) -> None:
    """Refuses ``--accelerator cuda`` or ``xpu`` where this Python's torch was built without that device (a CPU
    build never sees one): every arm would fail after the run began. Read without importing torch
    (``devicecount.torch_build``); nothing is refused where the build cannot be told. The arms run this Python."""
    from sprite.launch import devicecount

    if accelerator not in ("cuda", "xpu"):
        return
    build = devicecount.torch_build()
    if build and build != accelerator:
        raise UsageError(f"--accelerator {accelerator} cannot run here: this Python's torch is a {build} build.",
                         f"The job runs in an environment whose torch was installed without {accelerator} support.",
                         f"Run in the environment of a {accelerator} build of torch, or pass --accelerator {build}.")
