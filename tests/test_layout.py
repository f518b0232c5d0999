"""The code's map (issue 8): one import name per module, scheduler names in one registry, one error printer."""

from __future__ import annotations

import ast
import os
import re
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


# --- The package layout (issue 24): floors, no circles, no private names across modules, small folders. ---

LAUNCHER_HALF = ("cli", "spec", "values", "schedulers", "launch", "jobs", "recovery", "integrity", "contract",
                 "errors")
# Which package may import which (module-level and lazy imports alike). errors, contract and integrity are for
# everyone; each floor imports only the floors below it. spec reads the scheduler registry to check a spec's
# scheduler block, so it sits beside schedulers, above values.
MAY_IMPORT = {
    "errors": set(),
    "contract": {"errors"},
    "integrity": {"errors"},
    "values": {"errors", "contract"},
    "schedulers": {"errors", "contract", "values"},
    "spec": {"errors", "contract", "integrity", "values", "schedulers"},
    "launch": {"errors", "contract", "integrity", "values", "schedulers", "spec"},
    "jobs": {"errors", "contract", "integrity", "values", "schedulers", "spec", "launch"},
    "recovery": {"errors", "contract", "integrity", "values", "schedulers", "spec", "launch"},
    "cli": {"errors", "contract", "integrity", "values", "schedulers", "spec", "launch", "jobs", "recovery",
            "sprite"},
    "runtime": {"errors", "contract", "integrity"},
    "parity": {"errors", "contract", "integrity", "values", "schedulers", "spec", "launch", "runtime"},
}
# The one way up a floor: a command's body (never module import time) calls the torch half it runs.
LAZY_EXCEPTIONS = {("cli", "runtime"), ("cli", "parity")}
HEAVY = ("torch", "lightning", "pytorch_lightning", "transformers", "peft", "numpy")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[0] == "parity":
        parts = ["sprite", *parts]
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _source_files() -> dict[str, Path]:
    found = [*(REPO / "sprite").rglob("*.py"), *(REPO / "parity").rglob("*.py")]
    return {_module_name(p): p for p in found if "__pycache__" not in p.parts}


MODULES = _source_files()


def _imports(path: Path) -> list[tuple[str, int, bool]]:
    """(imported module, line, at module level) for every import in ``path``; ``from pkg import mod`` names the
    module ``pkg.mod`` when that is one of sprite's."""
    tree = ast.parse(path.read_text())
    top = set()
    stack = list(tree.body)
    while stack:  # module level includes imports under a top-level if/try
        node = stack.pop()
        top.add(id(node))
        for field in ("body", "orelse", "finalbody", "handlers"):
            stack.extend(x for x in getattr(node, field, []) if isinstance(node, (ast.If, ast.Try, ast.ExceptHandler)))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno, id(node) in top) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                found.append((full if full in MODULES else node.module, node.lineno, id(node) in top))
    return found


def _package(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "sprite"


def _edges() -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {m: set() for m in MODULES}
    for name, path in MODULES.items():
        for target, _, _ in _imports(path):
            if target in MODULES and target != name:
                edges[name].add(target)
    return edges


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(edges[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                top = stack.pop()
                group.append(top)
                if top == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycle_between_sprite_modules():
    assert _cycles(_edges()) == []


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_every_package_imports_only_the_floors_below_it():
    wrong = []
    for name, path in MODULES.items():
        mine = _package(name)
        if mine not in MAY_IMPORT:
            continue
        for target, line, top in _imports(path):
            if not target.startswith("sprite.") or target not in MODULES and not target.startswith("sprite.parity"):
                continue
            theirs = _package(target)
            if theirs == mine or theirs in MAY_IMPORT[mine]:
                continue
            if not top and (mine, theirs) in LAZY_EXCEPTIONS:
                continue
            wrong.append(f"{path.relative_to(REPO)}:{line} ({mine}) imports {target} ({theirs})")
    assert wrong == []


def test_the_launcher_half_never_imports_torch_or_the_runtime_at_import_time():
    wrong = []
    for name, path in MODULES.items():
        if _package(name) not in LAUNCHER_HALF:
            continue
        for target, line, top in _imports(path):
            root = target.split(".")[0]
            if top and (root in HEAVY or target.startswith(("sprite.runtime", "sprite.parity"))):
                wrong.append(f"{path.relative_to(REPO)}:{line} imports {target}")
    assert wrong == []


def test_importing_the_whole_launcher_half_loads_no_torch(tmp_path):
    names = sorted(n for n in MODULES if _package(n) in LAUNCHER_HALF and not n.endswith("__main__"))
    probe = ("import importlib, sys\n"
             f"for name in {names!r}:\n    importlib.import_module(name)\n"
             f"print(sorted({{m.split('.')[0] for m in sys.modules}} & {set(HEAVY)!r}))")
    # From outside the checkout, so the installed package is imported (parity/ is sprite.parity only there).
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_the_runtime_imports_only_the_contract_integrity_and_errors():
    wrong = []
    for name, path in MODULES.items():
        if _package(name) != "runtime":
            continue
        for target, line, _ in _imports(path):
            if target.startswith("sprite.") and _package(target) not in ("runtime", "contract", "integrity", "errors"):
                wrong.append(f"{path.relative_to(REPO)}:{line} imports {target}")
    assert wrong == []


def _private_imports(paths) -> list[str]:
    wrong = []
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("sprite"):
                private = [a.name for a in node.names if a.name.startswith("_") and not a.name.startswith("__")]
                if private:
                    wrong.append(f"{path.relative_to(REPO)}:{node.lineno} imports {', '.join(private)}")
    return wrong


def test_no_module_imports_another_modules_private_name():
    paths = [*MODULES.values(), *(REPO / "benchmarks").glob("*.py")]
    assert _private_imports(paths) == []


def test_the_private_name_check_finds_one(tmp_path):
    bad = REPO / "benchmarks" / f".layout_probe_{os.getpid()}.py"
    try:
        bad.write_text("from sprite.launch.supervisor import _hidden\n")
        assert _private_imports([bad]) == [f"benchmarks/{bad.name}:1 imports _hidden"]
    finally:
        bad.unlink()


def _loose(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob("*.py") if p.name not in ("__init__.py", "__main__.py"))


def test_folders_stay_small_and_prefixes_became_packages():
    assert len(_loose(REPO / "parity")) <= 12, _loose(REPO / "parity")
    assert not [n for n in _loose(REPO / "parity") if n.startswith(("bench_", "ckpt_"))]
    assert len(_loose(REPO / "sprite")) <= 12, _loose(REPO / "sprite")
    assert len(_loose(REPO / "sprite" / "runtime")) <= 25, _loose(REPO / "sprite" / "runtime")
    assert not [n for n in _loose(REPO / "sprite") if n.startswith(("cli_", "ckpt_", "dcp_"))]


def test_every_package_folder_is_installed():
    listed = set(re.findall(r'"(sprite(?:\.[a-z_]+)*)"', (REPO / "pyproject.toml").read_text()))
    folders = {_module_name(p) for p in [*(REPO / "sprite").rglob("__init__.py"), *(REPO / "parity").rglob("__init__.py")]}
    assert folders - listed == set()
