"""Shared fixtures. Every test runs with a clean rendezvous environment and must leave it clean."""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

REPO = Path(__file__).resolve().parents[1]
# Property-based tests (tests/test_fuzz_inputs.py) take their budget from a profile: "ci" (the default, about a
# minute on an idle 2-core machine) or "deep" for long local runs: HYPOTHESIS_PROFILE=deep pytest tests/test_fuzz_inputs.py
settings.register_profile("ci", max_examples=320, deadline=None, derandomize=True, database=None, print_blob=True,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.register_profile("deep", max_examples=5000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# A working directory for `python -c` / `python -m` probes: run from the checkout's root, Python would put the
# checkout's sprite/ first on sys.path, which lacks what installation maps in (sprite.parity, sprite.conf).
OUTSIDE_CHECKOUT = str(Path(sys.executable).parent)
LEAK_GUARDED = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "NODE_RANK")
SCHEDULER_VARS = ("PBS_JOBID", "PBS_NODEFILE", "SLURM_JOB_ID", "SLURM_JOB_NODELIST", "SLURM_NODELIST",
                  "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SPRITE_SITE")


# README's test command runs two pytest-xdist workers with --dist loadscope: a module's tests stay on one worker,
# so a module-scoped fixture (a whole ckpt-check, a parity run) is built once. These modules use the real Slurm
# (the ``slurm`` fixture, one cluster per worker that asks for it) and form one scope, so only one worker starts it.
SLURM_MODULES = ("tests/test_headline_commands.py", "tests/test_preempt_runs.py", "tests/test_secrets.py",
                 "tests/test_submit_files.py", "tests/test_submit_slurm.py", "tests/test_hardening_inputs.py",
                 "tests/test_stage.py")

if importlib.util.find_spec("xdist") is not None:
    def pytest_xdist_make_scheduler(config, log):
        from xdist.scheduler import LoadScopeScheduling

        class OneSlurm(LoadScopeScheduling):
            def _split_scope(self, nodeid: str) -> str:
                scope = super()._split_scope(nodeid)
                return "slurm" if scope.split("::")[0] in SLURM_MODULES else scope

        return OneSlurm(config, log)


def pytest_collection_modifyitems(config, items):
    """Refuse a module that uses the real Slurm without being listed in SLURM_MODULES."""
    stray = {item.nodeid.split("::")[0] for item in items if "slurm" in getattr(item, "fixturenames", ())}
    if stray - set(SLURM_MODULES):
        raise pytest.UsageError(f"{', '.join(sorted(stray - set(SLURM_MODULES)))} use(s) the slurm fixture: add it"
                                " to SLURM_MODULES in tests/conftest.py, so that one pytest-xdist worker runs them all.")


# The suite's CPU ranks are forks of one warm server a worker (sprite.launch.warmserver, docs/run.md): each
# launch then stops paying torch's and Lightning's import in its supervisor and every rank. A module whose tests
# are about processes as a fresh launch makes them (the process tree, what a rank imported, its memory) sets
# FRESH_RANKS = True; SPRITE_TEST_WARM=0 runs the whole suite without the server.
WARM_SERVER = "SPRITE_WARM_SERVER"


def sprite_free_env(strip=(), base=None) -> dict:
    """``base`` (os.environ) without the names in ``strip`` and without sprite's own variables, as on a machine
    where sprite never ran; the warm server's socket stays, since it belongs to the machine, not to a run."""
    return {k: v for k, v in (os.environ if base is None else base).items()
            if k not in strip and (k == WARM_SERVER or not k.startswith("SPRITE_"))}


def start_warm_server(folder: Path, env: dict | None = None, as_typed: bool = False) -> tuple[subprocess.Popen, Path]:
    """``python -m sprite.launch.warmserver`` with its socket ``folder/s.sock`` and its log ``folder/warm.log``
    (stderr in ``folder/server.err``), under the PYTHONSAFEPATH that sprite's plans give every rank (``as_typed``:
    under ``env`` as it is)."""
    from sprite.launch import warmserver

    sock = folder / "s.sock"
    env = os.environ if env is None else env
    with open(folder / "server.err", "w") as err:
        server = subprocess.Popen(warmserver.command(sock, folder / "warm.log"), cwd=OUTSIDE_CHECKOUT,
                                  start_new_session=True, env=env if as_typed else warmserver.environment(env),
                                  stdout=subprocess.DEVNULL, stderr=err)
    return server, sock


def stop_warm_server(server: subprocess.Popen) -> None:
    server.send_signal(signal.SIGTERM)
    try:
        server.wait(timeout=10)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()


def await_warm_server(timeout: float = 180) -> bool:
    """Wait until the warm server in SPRITE_WARM_SERVER (if any) listens; whether one does."""
    import time

    path = os.environ.get(WARM_SERVER)
    deadline = time.monotonic() + timeout
    while path and not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.1)
    return bool(path) and os.path.exists(path)


@pytest.fixture(scope="session", autouse=True)
def warm_server(tmp_path_factory):
    """One warm server for this worker's launches, its socket in SPRITE_WARM_SERVER. Launches made before it is
    ready (its imports take seconds) start their ranks as they always did."""
    if os.environ.get("SPRITE_TEST_WARM", "1") == "0" or not sys.platform.startswith("linux"):
        yield None
        return
    server, sock = start_warm_server(tmp_path_factory.mktemp("warm"))
    os.environ[WARM_SERVER] = str(sock)
    yield sock
    os.environ.pop(WARM_SERVER, None)
    stop_warm_server(server)


@pytest.fixture(scope="module", autouse=True)
def fresh_ranks(request):
    """For a module with FRESH_RANKS = True: no warm server while its tests and fixtures run."""
    if not getattr(request.module, "FRESH_RANKS", False) or WARM_SERVER not in os.environ:
        yield
        return
    saved = os.environ.pop(WARM_SERVER)
    yield
    os.environ[WARM_SERVER] = saved


@pytest.fixture(autouse=True)
def no_leaked_rank_env(request):
    """Fail any test that leaves MASTER_ADDR, MASTER_PORT, RANK or WORLD_SIZE behind for later tests."""
    before = {name: os.environ.get(name) for name in LEAK_GUARDED}
    yield
    leaked = {name: os.environ.get(name) for name in LEAK_GUARDED if os.environ.get(name) != before[name]}
    for name, value in before.items():  # restore, so one leak fails one test, not every later one
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    if leaked:
        pytest.fail(f"{request.node.nodeid} leaked into os.environ: {leaked}")


@pytest.fixture
def clean_env(monkeypatch) -> dict:
    """os.environ without any scheduler or rendezvous variable (as on a laptop), returned as a dict."""
    for name in (*LEAK_GUARDED, *SCHEDULER_VARS):
        monkeypatch.delenv(name, raising=False)
    # As in an activated venv: its bin (MPICH's mpiexec from the wheel) before /usr/bin, where
    # slurm-wlm-torque installs a Slurm-only mpiexec.
    monkeypatch.setenv("PATH", os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    return dict(os.environ)


@pytest.fixture(scope="session")
def sprite_cmd() -> list[str]:
    """The installed sprite command (the console script beside this Python)."""
    exe = Path(sys.executable).parent / "sprite"
    return [str(exe)] if exe.exists() else [shutil.which("sprite") or "sprite"]


@pytest.fixture(scope="session")
def example_script() -> str:
    return str(REPO / "examples" / "train.py")


def remove_tree(top) -> None:
    """Remove ``top`` without recursion: shutil.rmtree (and pytest's clean-up of old temporary folders, which
    uses it) recurses once a level and fails on a chain of 1,100 folders."""
    found, stack = [], [str(top)]
    while stack:
        here = stack.pop()
        found.append(here)
        with os.scandir(here) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                else:
                    os.unlink(entry.path)
    for here in reversed(found):
        os.rmdir(here)

