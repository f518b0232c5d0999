"""JobSpec: one validated description of a job, merged from a site profile, a YAML spec file and CLI flags.

Later layers win: site profile ``job:`` defaults, then the spec file, then CLI flags. Every value is checked
where it was written, so a rejection names its file and line (or its flag) and what is allowed.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Callable

from sprite import contract
from sprite.contract import console
from sprite.values import env as ev
from sprite.values import scheduler as sv
from sprite.values import grammar as v
from sprite.errors import Complain, UsageError, one_line, show
from sprite.spec.yamldoc import YamlDoc

ACCELERATORS = contract.ACCELERATORS
STRATEGIES = contract.STRATEGIES
LAUNCHERS = ("auto", "mpiexec", "srun", "torchrun", "local")
MPI_FLAVOURS = ("auto", "pals", "hydra", "openmpi")
PRECISIONS = (
    "auto", "32-true", "32", "bf16-mixed", "bf16", "16-mixed", "16", "bf16-true", "16-true", "64-true", "64",
)


@dataclass(frozen=True)
class JobSpec:
    """What to launch and how. ``None`` means "decide from the site profile or the allocation"."""

    script: str | None = None
    args: tuple[str, ...] = ()
    nodes: int | None = None
    devices: int | None = None
    accelerator: str = "auto"
    strategy: str = "auto"
    precision: str = "auto"
    launcher: str = "auto"
    mpi: str = "auto"
    site: str = "local"
    env: dict = field(default_factory=dict)
    pass_env: tuple[str, ...] = ()  # names whose values come from the launching (or submitting) environment
    secrets: tuple[str, ...] = ()  # names of secrets: values from that environment, masked when printed
    exclude: tuple[str, ...] = ()
    master_port: int | None = None
    resume: str = "never"  # never | auto | a checkpoint path (contract.RESUME)
    scheduler: dict = field(default_factory=dict)
    checks: str = "on"  # the runtime's fit-start contract checks: on (warn), off, strict (every warning an error)
    stall_timeout: float | None = None  # seconds without progress that stop the run (exit 124); None: no watchdog
    first_step_timeout: float | None = None  # the allowance from launch to the end of the first step
    save_timeout: float | None = None  # the allowance for one checkpoint save
    retries: int = 0  # relaunches after a failure
    spare_nodes: int = 0  # allocation nodes kept out of the first launch, to replace a failed node
    checkpoint_every: str | None = None  # seconds between sprite's own saves (as text), or "auto"; None: none
    mtbf: float | None = None  # seconds: the mean time between failures checkpoint_every auto plans for
    keep: int | None = None  # sprite's own clock checkpoints kept (None: 2)
    checkpoint_writer: str | None = None  # thread | process: where a sharded save is written; None: picked
    preempt_signal: str | None = None  # USR1 | USR2 | none (contract.PREEMPT_SIGNAL); None: preemption.DEFAULT
    requeue: bool = False  # ask the batch system to run the job again when the ranks stopped for preemption
    preflight: bool = False  # sprite run checks every node first (sprite preflight) and leaves failed ones out
    log_dir: str | None = None  # one output file per rank, DIR/rank<N>.log
    ranks: str | None = None  # console filter: "0", "all" or a list; None: all up to 16 ranks, else 0
    cpu_bind: str | None = None  # the launcher's --cpu-bind value, over the site profile's
    stage: str = "off"  # off | auto | an absolute node-local folder: run the ranks from a copy of the environment
    keep_stage: bool = False  # leave the staged copy on the nodes at the end
    # Where each value was written ("job.yaml:3: key 'nodes'", "--nodes"), so a later refusal can name it.
    origins: dict = field(default_factory=dict, compare=False, repr=False)

    def blame(self, key: str) -> str:
        """Where ``key``'s value came from, with the value: ``--nodes 3`` or ``job.yaml:3: key 'nodes' = 3``."""
        value = getattr(self, key)
        shown = ",".join(value) if isinstance(value, tuple) else show(value) if not isinstance(value, (str, int)) \
            else str(value)
        origin = self.origins.get(key)
        return f"{origin} = {one_line(shown, 200)}" if origin else f"--{key.replace('_', '-')} {one_line(shown, 200)}"


FIELD_NAMES = tuple(f.name for f in fields(JobSpec) if f.name != "origins")


def check_allowances(job: JobSpec) -> None:
    """Refuse a first-step or save allowance without a stall timeout, or shorter than it (an allowance lengthens
    the stall timeout; a shorter one was raised to it without a word), naming where each value was written
    (a flag, the spec, the site profile). sprite run checks it before the run, sprite qsub/sbatch before the job
    waits in the queue. Raises UsageError."""
    if job.stall_timeout is None:
        if job.first_step_timeout or job.save_timeout:
            given = " and ".join(job.blame(name) for name in ("first_step_timeout", "save_timeout")
                                 if getattr(job, name))
            raise UsageError(f"{given} needs a stall timeout.",
                             "The allowances lengthen the stall timeout for start-up and checkpoint saves.",
                             "Add --stall-timeout SECONDS (or stall_timeout: in the spec or site profile).")
        return
    short = [job.blame(name) for name in ("first_step_timeout", "save_timeout")
             if getattr(job, name) and getattr(job, name) < job.stall_timeout]
    if short:
        raise UsageError(f"{' and '.join(short)} {'is' if len(short) == 1 else 'are'} shorter than the stall timeout "
                         f"({job.blame('stall_timeout')}).", "An allowance lengthens the stall timeout for start-up "
                         "or a checkpoint save; a shorter one would be the stall timeout anyway.",
                         f"Give at least {job.stall_timeout:g} s, or leave the option out (start-up: 10x the stall "
                         "timeout, at least 300 s; a save: 2x).")


def _ranks(value: Any, complain: Complain) -> str:
    """``console.check_ranks``, after refusing a rank of more than 9 digits (int() refuses 4,300 and more)."""
    text = v.scalar_text(value) if not isinstance(value, bool) else None
    if text is not None and re.search(r"[0-9]{10}", text):
        raise complain(f"{show(value)} names a rank of more than 9 digits.", console.RANKS_ALLOWED)
    return console.check_ranks(value, complain)


CHECKS: dict[str, Callable[[Any, Complain], Any]] = {
    "script": v.string, "args": v.arguments, "nodes": v.nodes, "devices": v.ranks_per_node,
    "accelerator": v.choice(ACCELERATORS), "strategy": v.choice(STRATEGIES), "precision": v.choice(PRECISIONS),
    "launcher": v.choice(LAUNCHERS), "mpi": v.choice(MPI_FLAVOURS), "site": v.string, "env": ev.env,
    "pass_env": ev.env_names, "secrets": ev.env_names, "exclude": v.hosts, "master_port": v.port,
    "resume": v.resume, "scheduler": v.mapping, "checks": v.switch(contract.CHECK_MODES),
    "stall_timeout": v.timeout, "first_step_timeout": v.timeout, "save_timeout": v.timeout,
    "retries": v.non_negative_int, "spare_nodes": v.non_negative_int,
    "checkpoint_every": v.cadence, "mtbf": v.span, "keep": v.whole(1, 1000),
    "checkpoint_writer": v.choice(contract.CHECKPOINT_WRITERS),
    "preempt_signal": v.signal_name, "requeue": v.flag, "log_dir": v.string, "ranks": _ranks,
    "cpu_bind": sv.token, "preflight": v.flag, "stage": lambda value, complain: stage_place(value, complain),
    "keep_stage": v.flag,
}
assert set(CHECKS) == set(FIELD_NAMES)


STAGE_ALLOWED = "auto (a fresh folder in $TMPDIR), off, true, false, or an absolute node-local folder path"


def stage_place(value: Any, complain: Complain) -> str:
    """``stage``: off, auto, or an absolute folder (normalised; never / itself). true means auto, false off."""
    if isinstance(value, bool):
        return "auto" if value else "off"
    text = v.string(value, complain)
    if text.lower() in ("true", "false"):  # sprite's YAML reader gives every scalar as text
        return "auto" if text.lower() == "true" else "off"
    if text in ("auto", "off"):
        return text
    if not os.path.isabs(text) or os.path.normpath(text) == "/":
        raise complain(f"{show(value)} is not an absolute folder path below / (a node-local one, e.g. "
                       "/tmp/stage).", STAGE_ALLOWED)
    if len(text.encode()) > 3800 or any(len(part.encode()) > 200 for part in text.split("/")):
        raise complain(f"{show(value)} is too long a path: a name of over 200 bytes, or over 3800 in all (the "
                       "staged files are deeper still).", STAGE_ALLOWED)
    return os.path.normpath(text)


def check_values(values: dict, complain_for: Callable[[str], Complain]) -> dict:
    """Validate raw ``values`` field by field; ``complain_for(key)`` builds the error for that key.

    Raises whatever ``complain_for`` builds (a UsageError subclass) for an unknown key or a bad value.
    """
    out = {}
    for key, value in values.items():
        if key not in CHECKS:
            raise complain_for(key)("is not a job spec key.", ", ".join(FIELD_NAMES))
        out[key] = CHECKS[key](value, complain_for(key))
    return out


def from_document(doc: YamlDoc, section: tuple[str, ...] = ()) -> dict:
    """Validated fields of a spec file (or of a profile's ``job:`` block, given ``section``).

    Relative ``script``, ``resume``, ``log_dir`` and ``site`` paths resolve against the file's folder. Raises
    SpecError naming file, line and key.
    """
    checked = check_values(doc.mapping(section), doc.complainer(section))
    for key in ("script", "resume", "log_dir", "site"):
        if key in checked and is_path(key, checked[key]):
            checked[key] = absolute(Path(doc.source).parent / checked[key])
    return checked


def is_path(key: str, value: str) -> bool:
    """Whether ``value`` of ``key`` names a file or folder (resolved against the spec's folder): ``resume`` but
    never/auto, ``site`` when it is a profile's path (``sites._locate``: a .yaml/.yml name or one holding /)."""
    if key == "resume":
        return value not in contract.RESUME_MODES
    if key == "site":
        return value.endswith((".yaml", ".yml")) or "/" in value
    return True


def origins(doc: YamlDoc, layer: dict, section: tuple[str, ...] = ()) -> dict:
    """``{key: "file:line: key 'section.key'"}`` for every key of a validated ``layer`` read from ``doc``."""
    return {key: doc.where((*section, key)) for key in layer}


def absolute(path) -> str:
    """``path`` made absolute, symlinks resolved where that works (a symlink loop or an overlong name keeps the
    path as written, made absolute, so the refusal that follows names it)."""
    try:
        return str(Path(path).resolve())
    except (OSError, RuntimeError):  # RuntimeError: a symlink loop on Python < 3.13
        return os.path.abspath(path)


def from_flags(flags: dict) -> dict:
    """Validated fields given on the command line (``None`` values are flags not given). Raises UsageError."""
    given = {key: value for key, value in flags.items() if value is not None}

    def complain_for(key: str) -> Complain:
        flag = {"pass_env": "--env", "secrets": "--secret"}.get(key, "--" + key.replace("_", "-"))
        return lambda what, allowed="": UsageError(f"Option {flag}: {what}", "", f"Allowed: {allowed}." if allowed else "")

    return check_values(given, complain_for)


def merge(*layers: dict) -> JobSpec:
    """Build a JobSpec from validated layers, later layers winning; ``env`` and ``scheduler`` merge by key,
    ``pass_env`` and ``secrets`` add up (a later layer never drops a secret an earlier one named)."""
    spec = JobSpec()
    for layer in layers:
        changes = dict(layer)
        for key in ("env", "scheduler"):
            if key in changes:
                changes[key] = {**getattr(spec, key), **changes[key]}
        for key in ("pass_env", "secrets"):
            if key in changes:
                changes[key] = tuple(dict.fromkeys((*getattr(spec, key), *changes[key])))
        spec = replace(spec, **changes)
    return spec


def check_script(job: JobSpec, doc=None) -> None:
    """Raise UsageError (SpecError when the spec file set it) unless the job's script names an existing file."""
    if not job.script:
        if doc is not None:
            raise doc.error(("script",), "is missing: no training script given.", "script: path/to/train.py")
        raise UsageError("No training script given.", "",
                         "Pass SCRIPT after sprite's options, or set script: in --spec.")
    if not os.path.isfile(job.script):
        where = f"{job.origins['script']}: " if "script" in job.origins else ""
        folder = os.path.isdir(job.script)
        raise UsageError(
            f"{where}The training script {one_line(job.script, 300)} "
            f"{'is a folder, not a file' if folder else 'does not exist'}.",
            "The path names the script's folder, not the script." if folder else
            "The path is misspelled or relative to another folder (spec paths are relative to the spec file).",
            "Pass the path of an existing Python file.",
        )
