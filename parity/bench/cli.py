"""`sprite bench`: the training step measured (step time, tokens/s, FLOPs and MFU, memory, data loading,
communication) across world sizes, against baselines run in the same job. Mount ``app`` as `sprite bench` (the
shape of parity/command.py: its options run the benchmark, `run` is the same command, `compare` sits beside it).

Imports nothing heavy at module import (no torch, lightning or transformers): `sprite --help` stays instant.
Exit codes: 0 every launch measured (compare: no regression), 1 a launch failed (compare: step time
regressed), 2 bad usage.
"""

from __future__ import annotations

import pathlib
from typing import List, Optional

import typer

from sprite.errors import EXIT_CHECK_FAILED, EXIT_OK, SpriteError, UsageError
from sprite.parity.command import fail, harness
from sprite.parity.outdir import default_out, out_help

def _run(out: pathlib.Path, settings) -> int:
    from rich.console import Console

    from sprite.parity.bench import plot as bench_plot
    from sprite.parity.bench import report as bench_report
    from sprite.parity.bench import runner as bench_runner
    from sprite.parity.bench import store as bench_store

    console = Console()
    bench_runner.check_plans(out, settings)
    bench_store.claim(out, settings)
    console.print(f"results: {out}", markup=False, highlight=False, soft_wrap=True)
    with bench_runner.warm_launches(settings, console, bench_plot.prepare):
        results = bench_runner.run_all(out, settings, console)
    report = bench_report.build(out, settings, results)
    report["plot"] = bench_plot.write(out, report)
    bench_store.write_json(out / "bench.json", report)
    bench_report.show(report, console)
    console.print(f"report: {out / 'bench.json'}", markup=False, highlight=False, soft_wrap=True)
    return EXIT_CHECK_FAILED if report["failures"] else EXIT_OK


def bench(
    out: Optional[pathlib.Path] = typer.Option(None, help=out_help("A fresh folder for the records and the report.",
                                                                   "bench")),
    model: str = typer.Option("tiny", help="tiny, qwen2.5-0.5b-shape, or a local checkpoint folder."),
    lora: bool = typer.Option(True, "--lora/--full", help="Train LoRA adapters (default) or every weight."),
    strategy: str = typer.Option("ddp", help="ddp or fsdp (FSDP2)."),
    batch: int = typer.Option(8, help="Rows per rank per step."),
    seq: int = typer.Option(128, help="Tokens per row."),
    precision: str = typer.Option("32-true", help="32-true, bf16-mixed or bf16-true."),
    steps: int = typer.Option(40, help="Timed steps per launch (a multiple of --window)."),
    warmup: int = typer.Option(
        5, help="Untimed steps first (step 0 counts FLOPs), and before the probe at twice the batch."),
    window: int = typer.Option(10, help="Steps timed between two device synchronisations (1: every step)."),
    sweep: str = typer.Option("1", help="World sizes to measure, e.g. 1,2,4."),
    devices: int = typer.Option(0, help="Ranks per node; larger sweep points take whole nodes (0: one node)."),
    baseline: Optional[List[str]] = typer.Option(
        None, help="raw (plain PyTorch loop) or lightning (torchrun); repeatable."),
    repeats: int = typer.Option(1, help="Launches of every arm and world size, interleaved."),
    compile_: bool = typer.Option(
        False, "--compile", help="torch.compile each decoder block after step 0 (use --warmup 10 or more)."),
    measure_peak: bool = typer.Option(False, "--measure-peak", help="MFU against a timed GEMM, not the peak table."),
    accelerator: str = typer.Option("auto", help="auto, cpu, cuda or xpu."),
    attention: str = typer.Option("sdpa", help="Hugging Face attention: sdpa or eager."),
) -> None:
    """Launch every arm at every world size, then report.

    Example: sprite bench run --sweep 1,2 --devices 2 --out bench-out"""
    try:
        from sprite.parity.bench.options import settings_from

        settings = settings_from(model, lora, strategy, batch, seq, precision, steps, warmup, window, sweep,
                                 devices, list(baseline or []), repeats, compile_, measure_peak, accelerator, attention)
        out = out if out is not None else default_out("bench")
        code = _run(out, settings)
    except SpriteError as err:
        fail(err)
    raise typer.Exit(code)


app = harness("bench", bench,
              "Measure the training step (step time, tokens/s, MFU, memory, communication) across world sizes, "
              "against a plain PyTorch loop and Lightning under torchrun, in the same run.",
              ["sprite bench --sweep 1,2 --baseline raw --out runs/bench",
               "sprite bench compare runs/old runs/new --tolerance 0.05"])


@app.command("compare")
def compare_command(
    old: pathlib.Path = typer.Argument(..., help="The earlier bench.json (or its --out folder)."),
    new: pathlib.Path = typer.Argument(..., help="The later bench.json (or its --out folder)."),
    tolerance: float = typer.Option(0.05, help="Allowed slow-down as a fraction: 0.05 fails beyond 1.05x."),
) -> None:
    """Exit 1 if sprite's step time in NEW regressed beyond the tolerance against OLD at any world size.

    Example: sprite bench compare bench-old bench-new --tolerance 0.05"""
    try:
        if not 0 <= tolerance <= 10:  # NaN too: "ratio > 1 + nan" is never true, so nothing would ever fail
            raise UsageError(f"--tolerance {tolerance} is not a fraction between 0 and 10.", "A regression gate with "
                             "no finite bound passes everything.", "Pass a fraction such as 0.05.")
        from sprite.parity.bench.compare import compare, load

        rows = compare(load(old), load(new), tolerance)
    except SpriteError as err:
        fail(err)
    for row in rows:
        state = "REGRESSED" if row["regressed"] else "ok"
        typer.echo(f"world {row['world']}: {row['old_s'] * 1e3:.2f} ms -> {row['new_s'] * 1e3:.2f} ms, "
                   f"x{row['ratio']:.3f} (tolerance x{1 + tolerance:.3f}): {state}")
    raise typer.Exit(EXIT_CHECK_FAILED if any(row["regressed"] for row in rows) else EXIT_OK)
