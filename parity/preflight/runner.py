"""Launching `sprite preflight`: one launch over every node, planned as `sprite run` plans (``plan_run``), with a
deadline that a hanging rank cannot stretch, then the ranks' records read back and judged.

The launch ends by itself when every rank has written its final record. When some rank has written its final
record and no other record arrives for ``grace`` seconds, the rest cannot finish (their peers have left the
collectives), so the launch is stopped; ``deadline`` stops it in any case. The ranks that never wrote are then
named by host. No torch here.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import subprocess
import threading
import time
from typing import Mapping

from sprite.integrity import owner_only, write_new
from sprite.launch import ranklog
from sprite.launch.plan import LaunchPlan
from sprite.parity.preflight import criterion
from sprite.parity.preflight.settings import RECORD_SUFFIXES, SETTINGS_FILE, PreflightSettings

WORKER = pathlib.Path(__file__).with_name("worker.py")
LAUNCH_LOG = "launch.log"
THREADS = "OMP_NUM_THREADS"


def flags_for(out: pathlib.Path, base: dict, staged: str | None = None) -> dict:
    """JobSpec fields of the preflight launch: ``base`` (the user's world: nodes, devices, launcher, site, ...)
    running the worker, never resuming, each rank's output in ``out/logs``, unbuffered (``plan`` adds
    OMP_NUM_THREADS=1 where no layer sets it). No preemption signal (a preflight saves nothing; rank 0 would
    otherwise warn that its plain script gets no checkpoint-and-stop). It stages nothing itself: ``staged`` is the
    folder `sprite run --stage --preflight` has already staged on every node, whose interpreter its ranks then run
    (the preflight tries the start-up the job will have); without it (`sprite preflight`) the ranks run the
    environment where it is installed."""
    env = {**(base.get("env") or {}), "PYTHONUNBUFFERED": "1"}
    return {**base, "script": os.fspath(WORKER), "args": ["--out", os.fspath(out)], "strategy": "auto",
            "precision": "auto", "resume": "never", "log_dir": os.fspath(out / "logs"), "ranks": None, "env": env,
            "stall_timeout": None, "retries": None, "spare_nodes": 0, "stage": staged or "off", "keep_stage": False,
            "preempt_signal": "none"}


def plan(out: pathlib.Path, base: dict, environ: Mapping[str, str] = os.environ,
         spec_file: str | None = None, staged: str | None = None, allow_literal_secrets: bool = False) -> LaunchPlan:
    """Raises UsageError when the world cannot be launched here (as ``plan_run``; a literal secret is refused
    unless ``allow_literal_secrets``, as `sprite run --allow-literal-secrets` says). CPU ranks compute with one
    thread unless the shell, ``--env``, the spec or the site profile sets OMP_NUM_THREADS: simulated nodes share
    this machine's cores, and the check is of the node."""
    from sprite.launch.plan import assemble, plan_run

    flags = flags_for(out, base, staged)
    job, _ = assemble(flags, spec_file, environ, allow_literal_secrets)  # every layer's env, merged
    if THREADS not in environ and THREADS not in job.env:
        flags = {**flags, "env": {**flags["env"], THREADS: "1"}}
    return plan_run(flags, environ, spec_file, allow_literal_secrets)


def prepare(out: pathlib.Path, settings: PreflightSettings, launch: LaunchPlan) -> None:
    """Makes the output folder (0700; it must be new or empty) with the settings file and the rank folders."""
    owner_only.make_dirs(out)
    owner_only.make_dirs(out / "ranks")
    write_new(out / SETTINGS_FILE, settings.to_json().encode())
    ranklog.prepare(launch.log_dir)


@dataclasses.dataclass
class Launched:
    exit_code: int | None  # None: stopped by sprite (records in, or the deadline)
    stopped: str  # "" (ended by itself), "records in", "deadline"
    seconds: float


def _finals(out: pathlib.Path) -> int:
    """The ranks' records written after the rendezvous: final records and second timed windows."""
    return sum(1 for p in (out / "ranks").glob("rank*.json") if not p.name.endswith(RECORD_SUFFIXES["compute"]))


def watch(out: pathlib.Path, world: int, grace: float, stop: threading.Event, done: threading.Event,
          clock=time.monotonic, poll: float = 0.2) -> None:
    """Sets ``stop`` once some final record exists and none arrived for ``grace`` seconds while some are missing
    (or all are in and the launch still runs ``grace`` seconds later). Returns when ``done`` is set."""
    seen, since = 0, clock()
    while not done.wait(poll):
        count = _finals(out)
        if count != seen:
            seen, since = count, clock()
        if seen and clock() - since > grace:
            stop.set()
            return


def launch(out: pathlib.Path, launch_plan: LaunchPlan, deadline: float, grace: float = 5.0) -> Launched:
    """Runs the plan with its output in ``out/launch.log`` (see the module docstring). Raises UsageError when the
    launcher program is missing."""
    from sprite.launch.execute import run_plan

    stop, done = threading.Event(), threading.Event()
    poll = 0.2 if launch_plan.world.size <= 1024 else 1.0  # listing 24,576 records took 0.4 s here
    watcher = threading.Thread(target=watch, args=(out, launch_plan.world.size, grace, stop, done),
                               kwargs={"poll": poll}, daemon=True)
    start = time.monotonic()
    watcher.start()
    try:
        code = run_plan(launch_plan, log_path=out / LAUNCH_LOG, timeout=deadline, cancel=stop)
        return Launched(code, "", time.monotonic() - start)
    except InterruptedError:
        return Launched(None, "records in", time.monotonic() - start)
    except subprocess.TimeoutExpired:
        return Launched(None, "deadline", time.monotonic() - start)
    finally:
        done.set()
        watcher.join()


def _read(path: pathlib.Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def collect(out: pathlib.Path, world: int) -> tuple[dict[int, dict], dict[int, dict]]:
    """(compute records, final records) by rank, a final record with its rank's second timed window
    (``seconds_again``) where that was written; an unreadable record counts as missing. Read by 32 threads: on a
    parallel file system each small file costs a metadata round trip (36,864 files at 1,024 Aurora nodes)."""
    from concurrent.futures import ThreadPoolExecutor

    names = [(rank, kind, f"rank{rank}{suffix}") for rank in range(world) for kind, suffix in RECORD_SUFFIXES.items()]
    with ThreadPoolExecutor(max_workers=32) as pool:
        records = list(pool.map(lambda entry: _read(out / "ranks" / entry[2]), names))
    found: dict[str, dict[int, dict]] = {kind: {} for kind in RECORD_SUFFIXES}
    for (rank, kind, _), record in zip(names, records):
        if record is not None:
            found[kind][rank] = record
    final = {rank: {**record, **found["again"].get(rank, {})} for rank, record in found["final"].items()}
    return found["compute"], final


def log_tail(path: pathlib.Path, lines: int = 2, limit: int = 300) -> str:
    """The last ``lines`` non-empty lines of ``path`` as one line of at most ``limit`` characters ("" when there
    are none); only the file's last 8 KiB are read."""
    from sprite.errors import one_line

    try:
        with open(path, "rb") as file:
            file.seek(max(0, file.seek(0, os.SEEK_END) - 8192))
            text = file.read().decode(errors="replace")
    except OSError:
        return ""
    return one_line(" | ".join([line.strip() for line in text.splitlines() if line.strip()][-lines:]), limit)


def inconclusive(problem: str, launched: Launched, out: pathlib.Path) -> str:
    """One line on a launch whose records name no node (``criterion.launch_problem``): the problem, how the launch
    ended and the last lines of its launcher's output."""
    if launched.exit_code is not None:
        how = f"the launcher exited {launched.exit_code} after {launched.seconds:.1f} s"
    elif launched.stopped == "deadline":
        how = f"stopped by sprite at the deadline, after {launched.seconds:.1f} s"
    else:
        how = f"stopped by sprite after {launched.seconds:.1f} s ({launched.stopped})"
    tail = log_tail(out / LAUNCH_LOG)
    return f"{problem}; {how}; {LAUNCH_LOG} " + (f"ends: {tail}" if tail else "is empty")


def judge(out: pathlib.Path, settings: PreflightSettings, launch_plan: LaunchPlan, launched: Launched) -> dict:
    """The report (``report.build``) of a finished launch: every node judged, or the launch inconclusive."""
    from sprite.parity.preflight import report

    world = launch_plan.world
    computed, final = collect(out, world.size)
    nodes = criterion.judge(world.hosts, world.devices, computed, final, settings.expected_devices,
                            settings.slow_factor, settings.size)
    problem = criterion.launch_problem(computed, final, world.size)
    unsure = inconclusive(problem, launched, out) if problem else None
    return report.build(out, settings, launch_plan, launched, nodes, computed, final, unsure)


@dataclasses.dataclass(frozen=True)
class Options:
    """The preflight's own options (the world comes as JobSpec flags)."""

    deadline: float = 600.0
    collective_timeout: float = 60.0
    slow_factor: float = 2.0
    size: int = 512
    repeats: int = 9
    allreduce_mib: float = 4.0
    grace: float = 5.0


def settings_for(out: pathlib.Path, base: dict, faults: tuple, options: Options, environ: Mapping[str, str],
                 spec_file: str | None, launch_plan: LaunchPlan, allow_literal_secrets: bool = False
                 ) -> PreflightSettings:
    """What the ranks check: the accelerator and precisions the job uses (``base``'s precision, else the spec's or
    the site profile's; the preflight's own launch runs none), and the devices its site profile promises (every GPU
    node: the profile's ``devices``, else the ranks per node; a CPU rank: one). Raises UsageError for more ranks a
    node than the site's devices a node on a GPU accelerator (``check_devices``)."""
    from sprite import contract
    from sprite.launch.plan import assemble
    from sprite.parity.preflight.settings import precisions_for

    job, site = assemble({**flags_for(out, base), "precision": base.get("precision")}, spec_file, environ,
                         allow_literal_secrets)
    accelerator = launch_plan.env.get(contract.ACCELERATOR, "auto")
    promised = int(site.job.get("devices") or 0) or launch_plan.world.devices
    check_devices(job, site.name, accelerator, launch_plan.world.devices, promised)
    return PreflightSettings(accelerator=accelerator,
                             precisions=precisions_for(job.precision), size=options.size, repeats=options.repeats,
                             slow_factor=options.slow_factor, expected_devices=promised,
                             allreduce_mib=options.allreduce_mib, collective_timeout=options.collective_timeout,
                             rendezvous_timeout=options.deadline, faults=faults)


def check_devices(job, site: str, accelerator: str, ranks: int, promised: int) -> None:
    """Raises UsageError when ``ranks`` a node exceed the ``promised`` devices a node of a GPU ``accelerator``:
    a rank takes a device of its own (as ``plan.check_devices_here`` refuses on this machine), so every node would
    fail ``devices``. CPU ranks, and ``auto`` (CPU ranks with a CPU build of torch), are not refused."""
    from sprite.errors import UsageError

    if accelerator in ("cpu", "auto") or ranks <= promised:
        return
    asked = job.blame("devices") if job.devices else f"The allocation's {ranks} tasks a node"
    raise UsageError(f"{asked}: {ranks} ranks on every node, but the site profile {site} promises {promised} "
                     f"{accelerator} device(s) a node.", "Every rank takes a device of its own, so the preflight "
                     "would find every node short of devices.",
                     f"Use --devices {promised} or fewer, or --accelerator cpu for CPU ranks.")


def check_out(out: pathlib.Path) -> None:
    """Raises UsageError unless ``out`` is new or an empty folder."""
    from sprite.errors import UsageError

    if out.is_symlink() or out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(f"The output folder {out} exists and is not empty.", "Every preflight writes its records "
                         "once, into a fresh folder.", "Pass a new --out, or leave it out for one under "
                         "./sprite-runs/preflight/.")


def checked(out: pathlib.Path, base: dict, fault_values: list[str] | None, options: Options,
            environ: Mapping[str, str] = os.environ, spec_file: str | None = None, fault_option: str = "--fault",
            staged: str | None = None, allow_literal_secrets: bool = False) -> tuple[LaunchPlan, PreflightSettings]:
    """The preflight's launch plan and settings, every input checked and nothing made: ``sprite run --stage
    --preflight`` calls it before it stages anything. Raises UsageError for a world that cannot be launched here or
    that puts more GPU ranks on a node than the site's devices, a bad fault, a used ``out``, a missing launcher, a
    taken rendezvous port, or a literal secret unless ``allow_literal_secrets``."""
    from sprite.launch.execute import check_ready
    from sprite.parity.preflight.settings import parse_faults

    check_out(out)
    launch_plan = plan(out, base, environ, spec_file, staged, allow_literal_secrets)
    faults = parse_faults(fault_values, launch_plan.world.hosts, fault_option)
    settings = settings_for(out, base, faults, options, environ, spec_file, launch_plan, allow_literal_secrets)
    check_ready(launch_plan)
    return launch_plan, settings


def run_checked(out: pathlib.Path, launch_plan: LaunchPlan, settings: PreflightSettings, options: Options) -> dict:
    """Launches and judges a preflight ``checked`` planned; returns the report (saved as preflight.json). Raises
    UsageError for a rendezvous port taken since."""
    from sprite.launch.execute import check_ready
    from sprite.parity.preflight import report

    check_ready(launch_plan)
    prepare(out, settings, launch_plan)
    launched = launch(out, launch_plan, options.deadline, options.grace)
    result = judge(out, settings, launch_plan, launched)
    report.save(result, out)
    return result


def preflight(out: pathlib.Path, base: dict, fault_values: list[str] | None, options: Options,
              environ: Mapping[str, str] = os.environ, spec_file: str | None = None,
              fault_option: str = "--fault", staged: str | None = None) -> dict:
    """Plans, launches and judges one preflight into ``out``; returns the report (saved as preflight.json).

    Raises UsageError as ``checked`` does.
    """
    launch_plan, settings = checked(out, base, fault_values, options, environ, spec_file, fault_option, staged)
    return run_checked(out, launch_plan, settings, options)
