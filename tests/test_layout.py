"""The code's map (issue 8): one import name per module, scheduler names in one registry, one error printer."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

from sprite.errors import SpriteError, one_line, report

REPO = Path(__file__).resolve().parents[1]
PROBE = """
import importlib, sys
import sprite, sprite.parity.settings, sprite.conf, sprite.launch_templates
for name in ("sprite.sprite", "sprite.tests", "sprite.parity.parity"):
    try:
        importlib.import_module(name)
    except ImportError:
        continue
    raise SystemExit(name + " imported")
print("SPRITE=" + sprite.__file__)
"""


def _literals(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text())
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and node.value in ("pbs", "slurm")]


def test_scheduler_names_appear_only_in_the_schedulers_package():
    found = {}
    for path in [*(REPO / "sprite").rglob("*.py"), *(REPO / "parity").rglob("*.py")]:
        if "schedulers" in path.relative_to(REPO).parts:
            continue
        if hits := _literals(path):
            found[str(path.relative_to(REPO))] = hits
    assert found == {}


def test_the_package_never_extends_its_own_path():
    assert "__path__" not in (REPO / "sprite" / "__init__.py").read_text()


def test_ranks_started_in_the_checkout_root_import_one_sprite(sprite_cmd, clean_env, tmp_path):
    """A rank started from the checkout root (README's first command) imports the installed package's
    subpackages, and names such as sprite.sprite or sprite.tests do not exist."""
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    plan = subprocess.run([*sprite_cmd, "run", "--dry-run", "--json", str(probe)], env=clean_env, cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert plan.returncode == 0, plan.stderr
    env = {**clean_env, **json.loads(plan.stdout)["env"]}
    done = subprocess.run([sys.executable, "-m", "sprite.runtime", str(probe)], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SPRITE=" in done.stdout


def test_the_error_printer_keeps_one_bounded_line():
    err = SpriteError("bad value 'a\nb\x1b[31m'", "cause", "fix " + "x" * 5000)
    line = report(err)
    assert line.startswith("sprite: error: bad value 'a\\nb\\x1b[31m' cause fix ")
    assert "\n" not in line and "\x1b" not in line
    assert len(line) < 2100 and line.endswith("more characters cut)")
    assert one_line("plain") == "plain"
