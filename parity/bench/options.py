"""Validating `sprite bench`'s options into BenchSettings: every refusal is a one-line UsageError naming the
flag (exit code 2). No torch.
"""

from __future__ import annotations

import importlib.util

from sprite.errors import UsageError


def _sweep(text: str, devices: int) -> tuple[int, ...]:
    try:
        worlds = tuple(int(part) for part in text.split(","))
    except ValueError:
        worlds = ()
    if not worlds or min(worlds) < 1 or len(set(worlds)) != len(worlds):
        raise UsageError(f"--sweep {text!r} is not a list of distinct world sizes.", "",
                         "Write it as comma-separated rank counts, e.g. --sweep 1,2,4.")
    from sprite.values.grammar import MAX_RANKS_PER_NODE

    if not devices and max(worlds) > MAX_RANKS_PER_NODE:  # each point on one node: more ranks than a node takes
        raise UsageError(f"--sweep {text} puts {max(worlds)} ranks on one node, more than {MAX_RANKS_PER_NODE}.",
                         "Without --devices every point runs on one node.",
                         "Pass --devices N (ranks per node) to spread the larger points over nodes.")
    bad = [w for w in worlds if devices and w > devices and w % devices]
    if bad:
        raise UsageError(f"--sweep {text} has {bad[0]} ranks, which --devices {devices} ranks per node cannot fill.",
                         "A point larger than one node takes whole nodes.", f"Use multiples of {devices}.")
    return worlds


def _needs(lora: bool) -> None:
    missing = [n for n in ("transformers", "peft" if lora else "") if n and importlib.util.find_spec(n) is None]
    if missing:
        raise UsageError(f"sprite bench needs {' and '.join(missing)}, not installed here.",
                         "They are an optional extra of sprite (the recipe's model).",
                         "pip install 'sprite-hpc[parity]', then run again.")


def _check_choice(flag: str, value: str, allowed) -> None:
    if value not in allowed:
        raise UsageError(f"{flag} {value!r} is not supported.", "", f"Use one of: {', '.join(allowed)}.")


MOST_ROWS, MOST_STEPS, MOST_REPEATS = 1 << 20, 1_000_000, 1000  # beyond any benchmark that ends


def _counts(batch, seq, steps, warmup, window, repeats, devices, compile_) -> None:
    if min(batch, seq, window, repeats) < 1 or devices < 0:
        raise UsageError("--batch, --seq, --window and --repeats must be at least 1 (and --devices at least 0).",
                         "", "Pass positive counts.")
    from sprite.parity.usage import at_most

    at_most(("--batch", batch, MOST_ROWS), ("--seq", seq, MOST_ROWS), ("--steps", steps, MOST_STEPS),
            ("--warmup", warmup, MOST_STEPS), ("--repeats", repeats, MOST_REPEATS))  # 1e11 repeats: a hang
    if steps < window or steps % window:
        raise UsageError(f"--steps {steps} is not a multiple of --window {window}.",
                         "Timed steps are grouped in whole windows.",
                         f"Use --steps {max(window, steps - steps % window)}.")
    if warmup < (2 if compile_ else 1):
        raise UsageError(f"--warmup {warmup} is too short.", "Step 0 counts FLOPs (and --compile compiles after it).",
                         f"Use --warmup {2 if compile_ else 1} or more.")


def settings_from(model, lora, strategy, batch, seq, precision, steps, warmup, window, sweep, devices, baseline,
                  repeats, compile_, measure_peak, accelerator, attention):
    """Validated BenchSettings. Raises UsageError for anything out of range, naming the flag."""
    from sprite.contract import ACCELERATORS
    from sprite.parity.bench.settings import ATTENTIONS, BASELINES, PRECISIONS, STRATEGIES, BenchSettings

    for flag, value, allowed in (("--strategy", strategy, STRATEGIES), ("--precision", precision, PRECISIONS),
                                 ("--accelerator", accelerator, ACCELERATORS), ("--attention", attention, ATTENTIONS)):
        _check_choice(flag, value, allowed)
    for name in baseline:
        _check_choice("--baseline", name, BASELINES)
    if accelerator == "xpu" and "lightning" in baseline:
        raise UsageError("--baseline lightning cannot run on xpu.", "Lightning has no XPU accelerator without sprite.",
                         "Drop --baseline lightning on XPU (--baseline raw still runs).")
    _counts(batch, seq, steps, warmup, window, repeats, devices, compile_)
    from sprite.parity.usage import check_build, check_model

    check_build(accelerator)
    model = check_model(model)
    _needs(lora)
    return BenchSettings(
        model=model, lora=lora, strategy=strategy,
        batch=batch, seq=seq, precision=precision, steps=steps, warmup=warmup, window=window,
        sweep=_sweep(sweep, devices), devices=devices, baselines=tuple(dict.fromkeys(baseline)), repeats=repeats,
        compile=compile_, measure_peak=measure_peak, accelerator=accelerator, attention=attention)
