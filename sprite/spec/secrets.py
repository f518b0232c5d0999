"""Secret environment variables: which names are secret, where their values come from, how they are printed.

A variable is secret when the job spec lists it under ``secrets:`` (or ``sprite run --secret NAME``), or when its
name matches one of the site profile's ``secret_patterns`` (shell-style, any case; ``DEFAULT_PATTERNS`` unless
the profile says otherwise). A secret's value comes from the environment of the process that launches or
submits the job, never from a file or an argument list: a literal value in a spec, a site profile or
``--env NAME=VALUE`` is refused unless the user passes ``--allow-literal-secrets``. Every printer (``--dry-run``,
``--json``, ``sprite env``) shows values through :func:`mask`, which keeps the names. Stdlib only.
"""

from __future__ import annotations

from typing import Collection, Iterable, Mapping

from sprite.errors import UsageError
# DEFAULT_PATTERNS, MASK and matching_pattern live in sprite.values.env (the spec's validators use them too)
from sprite.values.env import DEFAULT_PATTERNS, MASKED as MASK, assignments, matching_pattern  # noqa: F401



def is_secret(name: str, listed: Collection[str], patterns: Collection[str]) -> bool:
    return name in listed or matching_pattern(name, patterns) is not None


def names(job, site) -> frozenset[str]:
    """Every secret variable of ``job`` (a JobSpec) under ``site``'s patterns: listed ones and matching names."""
    candidates = (*job.env, *job.pass_env, *job.secrets)
    return frozenset(n for n in candidates if is_secret(n, job.secrets, site.secret_patterns))


def mask(env: Mapping[str, str], secret: Collection[str]) -> dict[str, str]:
    """``env`` with the value of every name in ``secret`` replaced by ``***``: what every printer shows."""
    return {name: MASK if name in secret else value for name, value in env.items()}


def check_literals(job, site, allow: bool, sources: Mapping[str, str] = {}) -> None:
    """Refuse a secret given a literal value (in ``job.env``) unless ``allow``; ``sources`` maps a variable name
    to where its value was written (a file, ``--env``).

    Raises UsageError naming the variable.
    """
    for name in job.env:
        if allow or not is_secret(name, job.secrets, site.secret_patterns):
            continue
        why = "is listed as a secret" if name in job.secrets else \
            f"matches the secret pattern {matching_pattern(name, site.secret_patterns)}"
        raise UsageError(
            f"{name} {why} but {sources.get(name, 'the job spec')} gives it a literal value.",
            "A value written in a file or on a command line can be read by others (shared folders, the process "
            "table).",
            f"Remove the value, export {name} in the shell that runs sprite and list it under secrets: (or pass "
            f"--secret {name}); or pass --allow-literal-secrets.",
        )


def check_written(lines: Iterable[str], job, site, where: str) -> None:
    """Refuse a secret given a literal value inside text sprite writes into a job script as is (``where``: the
    scheduler block's ``setup`` or ``extra``), with or without --allow-literal-secrets: that flag passes a spec's
    ``env:`` secret through the submit command's environment, and nothing can keep a value written in a line out
    of the script (nor, as ``-v``/``--export``, out of the batch system's job record).

    Raises UsageError naming the variable, never its value.
    """
    for line in lines:
        text = " ".join(line) if isinstance(line, (tuple, list)) else str(line)  # setup: each command's words
        for name, value in assignments(text):
            bare = value.strip("'\"")
            if bare and is_secret(name, job.secrets, site.secret_patterns):
                raise UsageError(
                    f"scheduler.{where} gives the secret {name} a literal value ({name}={MASK}).",
                    f"sprite writes {where} into the job script as is, where others may read it (and -v/--export "
                    "puts it in the batch system's job record).",
                    f"Export {name} in the shell that submits and list it under secrets: (the job gets it without "
                    "it being written).")


def from_caller(job) -> tuple[str, ...]:
    """Names whose values the launching or submitting environment must provide (no literal in ``job.env``)."""
    return tuple(n for n in dict.fromkeys((*job.pass_env, *job.secrets)) if n not in job.env)


def resolve(job, environ: Mapping[str, str]) -> dict[str, str]:
    """The spec's literal values plus, for every name of :func:`from_caller`, its value in ``environ``.

    Raises UsageError naming the first such variable that ``environ`` does not set.
    """
    missing(from_caller(job), environ, job.secrets)
    return {**job.env, **{name: environ[name] for name in from_caller(job)}}


def missing(wanted: Collection[str], environ: Mapping[str, str], listed: Collection[str] = ()) -> None:
    """Raise UsageError naming the first of ``wanted`` that ``environ`` does not set."""
    for name in wanted:
        if name not in environ:
            what = "is a secret" if name in listed else "is to be passed from this environment (--env NAME, pass_env:)"
            raise UsageError(f"{name} {what} but is not set here.",
                             "Its value is taken from the environment of the shell that runs sprite.",
                             f"Export {name} first (export {name}=...), or stop listing it (secrets:, pass_env:, "
                             "--secret, --env NAME).")
