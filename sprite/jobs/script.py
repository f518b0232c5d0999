"""A job script: the scheduler's directives, the spec's setup lines, and the ``sprite run`` command it runs.

Setup lines are trusted shell, run with the user's rights (``sprite.values.scheduler`` says what is checked).

The template is package data (``sprite.launch_templates/job.sh.tmpl``) filled with ``string.Template``.
Directives come from the scheduler module (directive-safe tokens only); every word of the body goes through
``shlex.quote``. The job runs ``python -m sprite run`` with the fields written in the spec file and the site
named with ``--site``, so the launch inside the job is the plan of ``sprite run`` with the same site defaults.
Environment values never appear on that line: the spec's values are exported by the script (``export NAME=...``,
secrets excepted) and the line names the variables (``--env NAME``, ``--secret NAME``); a secret's value is never
written, the job takes it from the submitting environment (``Scheduler.pass_env_directives``).
"""

from __future__ import annotations

import shlex
import string
from importlib import resources
from pathlib import Path

from sprite import contract, schedulers
from sprite.spec import secrets as secret_env
from sprite.values import grammar as values
from sprite.launch import world
from sprite.errors import UsageError, show
from sprite.spec.scheduler_block import SchedulerBlock
from sprite.spec.sites import SiteProfile
from sprite.spec.job import JobSpec

TEMPLATE = "job.sh.tmpl"
VALUE_FLAGS = ("nodes", "devices", "accelerator", "strategy", "precision", "launcher", "mpi", "master_port", "resume",
               "stall_timeout", "first_step_timeout", "save_timeout", "retries", "spare_nodes", "preempt_signal",
               "cpu_bind", "log_dir", "ranks", "stage", "checkpoint_every", "mtbf", "keep", "checkpoint_writer")
SWITCH_FLAGS = ("requeue", "preflight", "keep_stage")  # true: --flag; false: --no-flag (over the site's true)


def check_text(key: str, text: str) -> str:
    """``text`` unchanged. Raises UsageError naming ``key`` when it holds a newline or other control character."""
    bad = values.control_char(text)
    if bad:
        raise UsageError(
            f"{key} = {show(text)} holds the control character {bad!r}.",
            "A newline or control character in a job script would end the line it is written on.",
            "Remove it from the spec (YAML block scalars | and > keep newlines).",
        )
    return text


def quote_words(key: str, words) -> str:
    """Shell-quote every word after checking it holds no control character."""
    return " ".join(shlex.quote(check_text(key, str(word))) for word in words)


def site_argument(site: SiteProfile) -> str:
    """The shipped profile's name when ``site`` is one, else the path of its YAML file."""
    shipped = resources.files("sprite.conf") / f"{site.name}.yaml"
    if shipped.is_file() and Path(str(shipped)).resolve() == Path(site.source).resolve():
        return site.name
    return str(Path(site.source).resolve())


def run_argv(python: str, site: SiteProfile, file_layer: dict, job: JobSpec, block=None,
             allow_literal_secrets: bool = False) -> list[str]:
    """``python -m sprite run --site S [flags written in the spec] SCRIPT ARGS...`` as a list of words.

    Variables are named, never given values: ``--secret NAME`` for a secret, ``--env NAME`` for the others. A
    site profile's literal secret, which the job reads from the profile again, needs ``--allow-literal-secrets``
    there too: it is passed on when ``allow_literal_secrets`` (the submission's flag) and the profile gives one. The
    scheduler block's ``preempt_signal`` becomes ``--preempt-signal`` (the ranks handle the signal the batch
    system sends) and ``requeue: true`` becomes ``--requeue --resume auto`` (the run that comes back continues
    from the newest valid checkpoint). Raises UsageError when the spec's own keys contradict those.
    """
    layer = {**file_layer, **_from_block(file_layer, block)} if block is not None else file_layer
    argv = [python, "-m", "sprite", "run", "--site", site_argument(site)]
    for key in VALUE_FLAGS:
        if key in layer and not (key == "mtbf" and job.checkpoint_every is None):  # alone it is refused as a flag
            argv += ["--" + key.replace("_", "-"), _flag_text(layer[key])]
    secret = secret_env.names(job, site)
    for name in dict.fromkeys((*layer.get("env", {}), *job.pass_env, *job.secrets)):
        argv += ["--secret" if name in secret else "--env", name]
    if layer.get("exclude"):
        argv += ["--exclude", ",".join(layer["exclude"])]
    argv += {"off": ["--no-checks"], "strict": ["--strict"]}.get(layer.get("checks", "on"), [])
    argv += [("--" if layer[key] else "--no-") + key.replace("_", "-") for key in SWITCH_FLAGS if key in layer]
    from_site = [name for name in job.env if name in secret and name not in layer.get("env", {})]
    argv += ["--allow-literal-secrets"] if allow_literal_secrets and from_site else []
    return argv + [job.script or "", *job.args]


def _flag_text(value) -> str:
    """A spec value as its flag reads it back: a number of seconds (a float, or the cadence's float text) without
    float noise (1.1 h is 3960.0000000000005 s, more decimals than a duration may have), anything else as text."""
    try:
        number = float(value) if isinstance(value, (float, str)) else None
    except ValueError:
        number = None
    return str(value) if number is None else f"{number:.9f}".rstrip("0").rstrip(".")


def _from_block(file_layer: dict, block) -> dict:
    """The run flags a scheduler block implies: its preemption signal, and requeue with ``resume: auto``."""
    out = {}
    if block.preempt_signal:
        name = block.preempt_signal[0]
        if file_layer.get("preempt_signal", name) != name:
            raise UsageError(f"preempt_signal: {file_layer['preempt_signal']} contradicts scheduler.preempt_signal: "
                             f"{name}@{block.preempt_signal[1]}.", "The ranks handle one signal; the scheduler "
                             "sends the other.", "Write the signal once, in scheduler.preempt_signal.")
        out["preempt_signal"] = name
    if block.requeue:
        if file_layer.get("resume", "auto") != "auto":
            raise UsageError(f"resume: {file_layer['resume']} with scheduler.requeue: true.", "A requeued job must "
                             "continue from its newest checkpoint, so the job script resumes with auto.",
                             "Remove resume: (or write resume: auto), or set requeue: false.")
        out.update(requeue=True, resume="auto")
    return out


def exports(file_layer: dict, secret) -> list[str]:
    """``export NAME=VALUE`` lines for the spec's variables that are not secrets (values shell-quoted).

    Raises UsageError for a value holding a control character, or a name bash cannot export (``é``).
    """
    for name in file_layer.get("env", {}):
        if not values.ENV_NAME.fullmatch(name):
            raise UsageError(f"env.{name} cannot be exported by a job script.", "bash accepts ASCII letters, digits "
                             "and _ in variable names only.", "Rename the variable.")
    return [f"export {name}={quote_words(f'env.{name}', [value])}"
            for name, value in file_layer.get("env", {}).items() if name not in secret]


def ranks_per_node(job: JobSpec, site: SiteProfile) -> int:
    """Ranks per node the job asks the scheduler for: the spec's devices, else the site's, else 1."""
    return world.ranks_per_node(job.devices, site)


def render(block: SchedulerBlock, argv: list[str], devices: int, spec_path: str, workdir: str,
           export_lines: tuple = (), script_path: str = "") -> str:
    """The whole job script; one that may requeue exports its own path (``contract.JOB_SCRIPT``: a batch system
    without a user requeue submits it again). Raises UsageError for a value that cannot be written safely."""
    scheduler = schedulers.get(block.kind)
    setup = [quote_words("scheduler.setup", words) for words in block.setup]
    setup = ("\n".join(setup) if setup else "# (no setup lines in the spec)") + "".join(
        "\n" + line for line in export_lines)
    own = [f"export {contract.JOB_SCRIPT}={shlex.quote(check_text('script path', script_path))}"] \
        if block.requeue and script_path else []
    template = string.Template((resources.files("sprite.launch_templates") / TEMPLATE).read_text())
    return template.substitute(
        directives="\n".join(scheduler.directives(block, devices) + scheduler.pass_env_directives(block.pass_env)),
        submit_program=scheduler.submit_program,
        launcher=scheduler.auto_launcher,
        scheduler=scheduler.label,
        spec=shlex.quote(check_text("spec path", spec_path)),
        workdir=shlex.quote(check_text("working directory", workdir)),
        setup=setup,
        launch="\n".join(own + scheduler.launch_lines(block, quote_words("launch command", argv))),
    )
