"""The pure part of ``--stage``: where the copy goes on every node, which interpreter the ranks run, and the
argv that runs the per-node tool once on each node through the job's own launcher. A value: printed by
``--dry-run``, compared in tests, executed by ``sprite.launch.stage.run``.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import sys
from dataclasses import dataclass
from typing import Mapping

from sprite import contract
from sprite.errors import UsageError
from sprite.schedulers import allocation as allocmod

TOOL = ("-m", "sprite.launch.stage.node")
COPPER_VIEW = "/tmp/{user}/copper"  # launch_copper.sh's default view (ALCF user guide, "Copper", data movement)
RAMDISK = "/dev/shm"  # the one folder under a kernel file system a stage folder may go in


@dataclass(frozen=True)
class StagePlan:
    """Stage into ``dir`` on ``hosts``; the ranks run ``python``; ``per_node`` runs the node tool once a node."""

    dir: str
    token: str
    python: str
    hosts: tuple[str, ...]
    per_node: tuple[str, ...]
    broadcast: str  # sbcast (Slurm copies the archive) | read (each node reads it) | copper | local
    cache: str  # the folder of packed archives, on a file system the nodes share
    keep: bool = False
    copper: tuple[str, ...] = ()  # the site's Copper launch script (and stop script), when broadcast is copper

    def node_argv(self, action: str, *extra: str) -> list[str]:
        return [*self.per_node, action, "--dir", self.dir, "--token", self.token, *extra]

    def describe(self) -> str:
        how = {"sbcast": "sbcast", "read": "each node reads the archive", "copper": "read through Copper",
               "local": "this machine"}[self.broadcast]
        end = "kept" if self.keep else "removed at the end"
        return (f"{self.dir} on {len(self.hosts)} node(s) ({how}; archive cached in {self.cache}; {end}); "
                f"ranks run {self.python}")


_INVOCATION = secrets.token_hex(16)  # this process's own: no other sprite run, before or after, has it


def token_of(run_env: Mapping[str, str], job_id: str) -> str:
    """This run's mark on its stage folders: the same for every attempt of one ``sprite run``, and for no other
    invocation, even one given the same --run-dir in the same job (a folder a run before kept is not this run's)."""
    seed = f"{_INVOCATION}|{run_env.get(contract.RUN_DIR, '')}|{job_id}"
    return hashlib.sha256(seed.encode()).hexdigest()[:16]


def folder(where: str, token: str, root: str | None, environ: Mapping[str, str]) -> str:
    """``where`` itself when it is a folder path; for ``auto`` a fresh ``sprite-stage-<token>`` in the site's
    ``stage_root`` (a local SSD or ramdisk), else ``$TMPDIR``, else /tmp."""
    if where != "auto":
        return where
    base = root or environ.get("TMPDIR") or "/tmp"
    base = base if os.path.isabs(base) else "/tmp"
    return os.path.join(base, f"sprite-stage-{token}")


def _check_here(stage_dir: str) -> None:
    """Staging on this machine: the folder's parent must be a folder this user may write (checked before anything
    is packed). Raises UsageError."""
    from sprite.launch import folders

    parent = os.path.dirname(stage_dir)
    if os.path.realpath(parent).startswith(RAMDISK):  # a ramdisk is a good place for a copy, though under /dev
        why = None if os.access(parent, os.W_OK | os.X_OK) else f"cannot be made: {parent} is not writable for you"
    else:
        why = folders.problem(stage_dir)
    why = why or (None if os.path.isdir(parent) else f"cannot be made: {parent} is gone")
    if why:
        raise UsageError(f"--stage: the stage folder {stage_dir} {why}.", "The path is misspelled, or $TMPDIR (for "
                         "auto) names a folder that is gone.", "Pass --stage auto or a folder below one you may write "
                         "(e.g. /tmp/stage).")


def interpreter(stage_dir: str) -> str:
    """The staged interpreter: the rebuilt venv's, or a conda environment's own (``source.py`` says which)."""
    version = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    sub = "env" if sys.prefix != sys.base_prefix else "base"
    return os.path.join(stage_dir, sub, "bin", version)


def cache_dir(environ: Mapping[str, str]) -> str:
    """``$SPRITE_STAGE_CACHE``, else ``$XDG_CACHE_HOME/sprite/stage``, else ``~/.cache/sprite/stage``."""
    if environ.get("SPRITE_STAGE_CACHE"):
        return os.path.abspath(environ["SPRITE_STAGE_CACHE"])
    base = environ.get("XDG_CACHE_HOME") or os.path.join(environ.get("HOME") or os.path.expanduser("~"), ".cache")
    return os.path.join(base, "sprite", "stage")


def per_node(world, hosts: tuple[str, ...], python: str, is_root: bool) -> tuple[str, ...]:
    """argv that starts the node tool once on each of ``hosts`` with the job's own launcher (none: here)."""
    tool = (python, *TOOL)
    n, names = str(len(hosts)), ",".join(hosts)
    if world.alloc.scheduler == "none" or world.flavour == "local":  # the local launcher: this machine alone
        return tool
    if world.flavour == "srun":
        return ("srun", "--nodes", n, "--ntasks", n, "--ntasks-per-node", "1", "--nodelist", names,
                "--kill-on-bad-exit=1", "--export=ALL", *tool)
    if world.flavour == "pals":
        return ("mpiexec", "-n", n, "--ppn", "1", "--hosts", names, "--envall", *tool)
    if world.flavour == "hydra":
        return ("mpiexec", "-n", n, "-ppn", "1", "-hosts", names, *tool)
    if world.flavour == "openmpi":
        root = ("--allow-run-as-root",) if is_root else ()
        return ("mpirun", "-n", n, "--map-by", "ppr:1:node", "--host", ",".join(f"{h}:1" for h in hosts),
                *root, "-x", "PATH", "-x", "PYTHONSAFEPATH", *tool)
    raise UsageError(f"--stage does not work with the {world.flavour} launcher across nodes yet.",
                     "torchrun's agent starts the ranks with its own interpreter, which sprite cannot stage.",
                     "Launch with mpiexec or srun (--launcher), or drop --stage.")


def build(spec, site, world, python: str, environ: Mapping[str, str], run_env: Mapping[str, str],
          is_root: bool = False) -> StagePlan:
    """The StagePlan of ``spec.stage`` for ``world``. Pure. Raises UsageError for torchrun across nodes."""
    if world.flavour == "torchrun":
        raise UsageError("--stage does not work with torchrun yet.",
                         "torchrun's agent starts the ranks with its own interpreter, which sprite cannot stage.",
                         "Launch with --launcher local, mpiexec or srun, or drop --stage.")
    token = token_of(run_env, world.alloc.job_id)
    stage_dir = folder(spec.stage, token, site.stage_root, environ)
    alloc = world.alloc
    if spec.exclude and alloc.scheduler != "none":
        alloc = allocmod.exclude(alloc, spec.exclude, spec.origins.get("exclude", "--exclude"))
    hosts = alloc.hosts  # every usable host, spare ones too (a retry may move onto them)
    if alloc.scheduler == "none" or world.flavour == "local":
        broadcast, hosts = "local", world.hosts
        if alloc.scheduler == "none":  # this machine is the node (a job script's plan is made on a login node)
            _check_here(stage_dir)
    elif world.flavour == "srun":
        # sbcast writes to every node of the job: where a node is left out (--exclude, a node the preflight found
        # failing), each kept node reads the archive instead, as under mpiexec.
        broadcast = "sbcast" if hosts == world.alloc.hosts else "read"
    else:
        broadcast = "copper" if site.copper else "read"
    copper = (site.copper, site.copper.replace("launch_copper", "stop_copper")) if broadcast == "copper" else ()
    return StagePlan(stage_dir, token, interpreter(stage_dir), tuple(hosts),
                     per_node(world, tuple(hosts), python, is_root), broadcast, cache_dir(environ),
                     spec.keep_stage, copper)
