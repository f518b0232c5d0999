"""Render a PBS or Slurm job script from a SchedulerBlock and the ``sprite run`` command the job runs.

Templates are package data (``sprite.launch_templates``) filled with ``string.Template``. Directives come
from submit_directives (directive-safe tokens only); every word of the body goes through ``shlex.quote``.
"""

from __future__ import annotations

import shlex
import string
from importlib import resources

from sprite import submit_directives, submit_values
from sprite.errors import UsageError
from sprite.scheduler_spec import SchedulerBlock

TEMPLATES = {"pbs": "pbs.sh.tmpl", "slurm": "slurm.sh.tmpl"}


def check_text(key: str, text: str) -> str:
    """``text`` unchanged. Raises UsageError naming ``key`` when it holds a newline or other control character."""
    bad = submit_values.control_char(text)
    if bad:
        raise UsageError(
            f"{key} = {text!r} holds the control character {bad!r}.",
            "A newline or control character in a job script would end the line it is written on.",
            "Remove it from the spec (YAML block scalars | and > keep newlines).",
        )
    return text


def quote_words(key: str, words) -> str:
    """Shell-quote every word after checking it holds no control character."""
    return " ".join(shlex.quote(check_text(key, str(word))) for word in words)


def _pbs_timer(command: str, signal: str, delay: int) -> list[str]:
    # PBS Pro has no directive for an early warning signal, so the script sends it itself `delay` seconds
    # into the job; the timer's output goes to /dev/null so it never holds the job's output open.
    return [
        f"{command} &",
        "sprite_pid=$!",
        f"( sleep {delay} && kill -s {signal} \"$sprite_pid\" ) >/dev/null 2>&1 &",
        "timer_pid=$!",
        "status=0",
        "wait \"$sprite_pid\" || status=$?",
        "kill \"$timer_pid\" 2>/dev/null || true",
        "exit \"$status\"",
    ]


def launch_lines(block: SchedulerBlock, argv: list[str]) -> list[str]:
    """The lines that start ``argv`` (``python -m sprite run ...``) in the job. Raises UsageError (control chars)."""
    command = quote_words("launch command", argv)
    if block.kind == "pbs" and block.preempt_signal:
        signal, before = block.preempt_signal
        delay = max(1, submit_values.seconds(block.walltime) - before)
        return _pbs_timer(command, signal, delay)
    return [f"exec {command}"]


def render(block: SchedulerBlock, argv: list[str], devices: int, spec_path: str, workdir: str) -> str:
    """The whole job script. Raises UsageError for a value that cannot be written safely."""
    builder = submit_directives.pbs if block.kind == "pbs" else submit_directives.slurm
    setup = [quote_words("scheduler.setup", words) for words in block.setup]
    template = string.Template((resources.files("sprite.launch_templates") / TEMPLATES[block.kind]).read_text())
    return template.substitute(
        directives="\n".join(builder(block, devices)),
        spec=shlex.quote(check_text("spec path", spec_path)),
        workdir=shlex.quote(check_text("working directory", workdir)),
        setup="\n".join(setup) if setup else "# (no setup lines in the spec)",
        launch="\n".join(launch_lines(block, argv)),
    )
