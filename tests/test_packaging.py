"""What a plain `pip install .` must carry, and what the planning path must never import."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest

from conftest import OUTSIDE_CHECKOUT
from sprite.spec import sites


def test_site_profiles_and_example_ship_inside_the_package():
    assert {"aurora", "polaris", "perlmutter", "local"} <= set(sites.available())
    assert (resources.files("sprite.examples") / "train.py").is_file()
    aurora = sites.load("aurora")
    assert aurora.scheduler == "pbs" and aurora.mpi == "pals" and aurora.job["devices"] == 12
    assert aurora.job["env"]["ZE_FLAT_DEVICE_HIERARCHY"] == "FLAT"


def test_planning_and_help_import_no_torch_or_lightning(clean_env, example_script):
    probe = f"""
import sys
from sprite.cli import app as cli
for argv in (["--help"], ["run", "--help"], ["env", "--json"], ["run", "--dry-run", "--json", {example_script!r}],
             ["bench", "--help"], ["bench", "compare", "--help"]):
    try:
        cli.main(argv)
    except SystemExit as exit:
        assert exit.code == 0, (argv, exit.code)
heavy = sorted({{m.split('.')[0] for m in sys.modules}} & {{'torch', 'lightning', 'pytorch_lightning', 'transformers'}})
sys.stderr.write("HEAVY=" + repr(heavy))
"""
    result = subprocess.run([sys.executable, "-c", probe], env=clean_env, capture_output=True, text=True, timeout=60,
                            cwd=OUTSIDE_CHECKOUT)
    assert result.returncode == 0, result.stderr
    assert result.stderr.endswith("HEAVY=[]"), result.stderr[-500:]


def test_sprite_env_reports_this_machine(sprite_cmd, clean_env):
    result = subprocess.run([*sprite_cmd, "env", "--json"], env=clean_env, capture_output=True, text=True, timeout=60)
    info = json.loads(result.stdout)
    assert info["scheduler"] == "none" and info["nodes"] == 1 and info["backend"] in ("gloo", "nccl", "xccl")


def test_every_subpackage_of_sprite_is_installed():
    """A plain `pip install .` carries only the packages pyproject.toml lists: a new subpackage must be listed."""
    tomllib = pytest.importorskip("tomllib")
    repo = Path(__file__).resolve().parents[1]
    listed = set(tomllib.loads((repo / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    on_disk = {".".join(p.parent.relative_to(repo).parts) for p in (repo / "sprite").rglob("__init__.py")}
    assert on_disk <= listed, sorted(on_disk - listed)


def _python_310() -> str | None:
    """A Python 3.10 that runs (pyenv's shim on PATH answers for a version it does not select, so each is tried)."""
    import glob
    import shutil

    for python in [*sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.10*/bin/python3.10"))),
                   *sorted(glob.glob("/root/.pyenv/versions/3.10*/bin/python3.10")), shutil.which("python3.10")]:
        if python and subprocess.run([python, "-c", "import sys; assert sys.version_info[:2] == (3, 10)"],
                                     capture_output=True, timeout=60).returncode == 0:
            return python
    return None


def test_every_module_compiles_under_the_oldest_python_pyproject_allows():
    """pyproject.toml says requires-python >= 3.10: every module of sprite (and of its parity harnesses, and the
    test files) is Python 3.10 syntax. Compiled in memory by a 3.10 interpreter where one is installed (this
    machine's pyenv has 3.10.13); the login-node commands under 3.10 were run by hand (docs/runs/cpu-2026-12-04-b)."""
    python = _python_310()
    if python is None:
        pytest.skip("no Python 3.10 interpreter on this machine")
    root = Path(__file__).resolve().parents[1]
    check = ("import sys\nbad = []\nfor path in sys.argv[1:]:\n    try:\n"
             "        compile(open(path, encoding='utf-8').read(), path, 'exec')\n"
             "    except SyntaxError as err:\n        bad.append(f'{path}:{err.lineno}: {err.msg}')\n"
             "print('\\n'.join(bad))\nsys.exit(1 if bad else 0)\n")
    files = [str(p) for folder in ("sprite", "parity", "tests", "benchmarks") for p in (root / folder).rglob("*.py")]
    done = subprocess.run([python, "-c", check, *files], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and len(files) > 100, done.stdout + done.stderr


def test_no_module_uses_a_standard_library_name_newer_than_python_3_10():
    """requires-python >= 3.10 covers the standard library too: vermin (a maintained detector of the Python
    version each stdlib name and syntax needs) finds nothing in sprite, its harnesses, tests, benchmarks or examples
    that 3.10 lacks. It found `hashlib.file_digest` (3.11) in integrity.sha256_file, which ckpt-check calls."""
    import shutil

    root = Path(__file__).resolve().parents[1]
    vermin = shutil.which("vermin", path=os.path.dirname(sys.executable)) or shutil.which("vermin")
    assert vermin, "vermin is in the test extra (pip install '.[test]')"
    done = subprocess.run([vermin, "--no-tips", "--no-parse-comments", "-t=3.10-", "--violations",
                           "--eval-annotations", *(str(root / d) for d in ("sprite", "parity", "tests", "benchmarks",
                                                                             "examples"))],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]


def test_the_integrity_facade_runs_under_python_3_10(tmp_path):
    """sprite.integrity is stdlib only (docs/architecture.md): under a real Python 3.10 it seals a file, verifies
    it and hashes it as this Python does."""
    python = _python_310()
    if python is None:
        pytest.skip("no Python 3.10 interpreter on this machine")
    from sprite import integrity

    target = tmp_path / "state.bin"
    target.write_bytes(b"sprite" * 100_000)
    code = ("import sys\nfrom sprite import integrity\nintegrity.seal(sys.argv[1], {'step': 3})\n"
            "verdict = integrity.verify(sys.argv[1])\nassert verdict.valid, verdict.reason\n"
            "print(integrity.sha256_file(sys.argv[1]))\n")
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([python, "-c", code, str(target)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(root)}, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == integrity.sha256_file(target)
