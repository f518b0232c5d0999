"""What a job script runs on its first compute node: ``python -m sprite run`` with the spec's own fields.

Only the fields written in the spec file become flags; the site profile is named with ``--site`` so the
job applies the same site defaults that ``sprite run --spec`` would. The launch inside the job is therefore
the plan of ``sprite run``: mpiexec under PBS, srun under Slurm.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from sprite import world
from sprite.sites import SiteProfile
from sprite.spec import JobSpec

VALUE_FLAGS = ("nodes", "devices", "accelerator", "strategy", "precision", "launcher", "mpi", "master_port")


def site_argument(site: SiteProfile) -> str:
    """The shipped profile's name when ``site`` is one, else the path of its YAML file."""
    shipped = resources.files("sprite.conf") / f"{site.name}.yaml"
    if shipped.is_file() and Path(str(shipped)).resolve() == Path(site.source).resolve():
        return site.name
    return str(Path(site.source).resolve())


def run_argv(python: str, site: SiteProfile, file_layer: dict, job: JobSpec) -> list[str]:
    """``python -m sprite run --site S [flags written in the spec] SCRIPT ARGS...`` as a list of words."""
    argv = [python, "-m", "sprite", "run", "--site", site_argument(site)]
    for key in VALUE_FLAGS:
        if key in file_layer:
            argv += ["--" + key.replace("_", "-"), str(file_layer[key])]
    for name, value in file_layer.get("env", {}).items():
        argv += ["--env", f"{name}={value}"]
    if file_layer.get("exclude"):
        argv += ["--exclude", ",".join(file_layer["exclude"])]
    argv += {"off": ["--no-checks"], "strict": ["--strict"]}.get(file_layer.get("checks", "on"), [])
    return argv + [job.script or "", *job.args]


def ranks_per_node(job: JobSpec, site: SiteProfile) -> int:
    """Ranks per node the job asks the scheduler for: the spec's devices, else the site's, else 1."""
    return world.ranks_per_node(job.devices, site)
