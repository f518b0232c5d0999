"""Launching the arms of `sprite bench`: sprite's arm through the plan `sprite run` executes, the baselines
through the same plan built for torchrun with sprite's runtime taken out, repeats interleaved.

Every launch of a repeat runs every sweep point, arms in an order that rotates from repeat to repeat, so a
drift of the machine (clocks, other jobs) spreads over all arms instead of one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pathlib
import time
from typing import Mapping

from rich.console import Console

from sprite.parity.bench import store as bench_store
from sprite.parity.bench.settings import BenchSettings
from sprite.parity.launch import job_fields
from sprite.parity.launch import run as run_launch
from sprite.parity.progress import ProgressBoard, processes
from sprite.launch.plan import LaunchPlan
from sprite.integrity.writeonce import write_new

SCRIPTS = {"sprite": "step.py", "lightning": "step.py", "raw": "raw.py"}


def _flags(out: pathlib.Path, settings: BenchSettings, world: int, arm: str, repeat: int) -> dict:
    nodes, devices = settings.placement(world)
    # every arm the same threads (torchrun alone would give 1, sprite cores/ranks)
    return job_fields(str(pathlib.Path(__file__).with_name(SCRIPTS[arm])),
                      ["--out", os.fspath(out), "--world", str(world), "--arm", arm, "--repeat", str(repeat)],
                      devices=devices, nodes=nodes, strategy=settings.strategy, precision=settings.precision,
                      accelerator=settings.accelerator, threads=max(1, (os.cpu_count() or 1) // devices))


def without_sprite(plan: LaunchPlan) -> LaunchPlan:
    """A torchrun plan whose ranks run the script itself instead of ``-m sprite.runtime SCRIPT``, with none of
    sprite's SPRITE_* variables: torchrun (one agent per node, as sprite starts it) runs the plain script."""
    argv = list(plan.argv)
    at = next((i for i in range(1, len(argv)) if argv[i - 1:i + 1] == ["-m", "sprite.runtime"]), None)
    if at is None:
        raise ValueError(f"not a torchrun plan of sprite's runtime: {argv}")
    del argv[at - 1:at + 1]
    env = {key: value for key, value in plan.env.items() if not key.startswith("SPRITE_")}
    return dataclasses.replace(plan, argv=argv, env=env)


def plan_arm(out: pathlib.Path, settings: BenchSettings, world: int, arm: str, repeat: int,
             environ: Mapping[str, str] = os.environ) -> LaunchPlan:
    """The plan of one launch in the allocation ``environ`` describes. Raises UsageError when the world cannot
    be launched there (e.g. more nodes than the allocation holds)."""
    from sprite.launch.plan import plan_run

    flags = _flags(out, settings, world, arm, repeat)
    if arm == "sprite":
        return plan_run(flags, environ)
    return without_sprite(plan_run({**flags, "launcher": "torchrun"}, environ))


def launches(settings: BenchSettings) -> list[tuple[int, int, str]]:
    """(repeat, world, arm) of every launch in run order: repeats outermost, arms rotated per repeat."""
    order = []
    for repeat in range(settings.repeats):
        shift = repeat % len(settings.arms)
        arms = settings.arms[shift:] + settings.arms[:shift]
        order += [(repeat, world, arm) for world in settings.sweep for arm in arms]
    return order


def check_plans(out: pathlib.Path, settings: BenchSettings) -> None:
    """Plans every (world, arm) once before anything runs. Raises UsageError for one that cannot run here."""
    for world in settings.sweep:
        for arm in settings.arms:
            plan_arm(out, settings, world, arm, 0)


def warm_launches(settings: BenchSettings, console: Console, meanwhile=lambda: None):
    """How the launches' ranks start. With baselines, every arm as a fresh interpreter (a warm server's forks
    would start sprite's arm differently from the baselines, which run their script without sprite's runtime).
    Without, on CPU, as forks of one warm server (sprite.launch.warmserver; the user's, or one of the bench's
    own that has also imported the model's libraries), so the sweep pays the imports once, not once a launch;
    ``meanwhile()`` runs while the bench's own server imports."""
    import sys

    from sprite import contract
    from sprite.launch import warmserver, warmstart

    if settings.baselines:
        return warmserver.withheld()
    if not warmstart.wanted([sys.executable, "-m", "sprite.runtime"], {contract.ACCELERATOR: settings.accelerator}):
        return contextlib.nullcontext()
    return warmserver.private(("transformers", "peft"),
                              lambda line: console.print(line, markup=False, highlight=False), meanwhile)


def run_all(out: pathlib.Path, settings: BenchSettings, console: Console) -> list[dict]:
    """Runs every launch to completion (a failed one does not stop the rest); returns one entry per launch.

    Progress, as for `sprite parity`: each launch's state and elapsed time, and an estimate of what is left
    (launches of the same world take about as long as each other)."""
    order, results = launches(settings), []
    names = {entry: f"world {entry[1]} {entry[2]} #{entry[0] + 1}" for entry in order}
    items = [(names[entry], processes(entry[1])) for entry in order]
    with ProgressBoard(console, items, "bench launches") as board:
        for entry in order:
            repeat, world, arm = entry
            log = bench_store.log_path(out, world, arm, repeat)
            bench_store.make_dir(log.parent)
            write_new(log, b"")  # 0600, and never a log of an earlier run
            board.start(names[entry])
            start = time.monotonic()
            code = run_launch(plan_arm(out, settings, world, arm, repeat), log)
            seconds = time.monotonic() - start
            board.finish(names[entry], code == 0, "" if code == 0 else f"exit code {code}, see {log}")
            results.append({"repeat": repeat, "world": world, "arm": arm, "exit_code": code, "seconds": seconds,
                            "log": os.fspath(log.relative_to(out))})
    return results
