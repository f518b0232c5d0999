"""What ``--stage`` copies: the environment this interpreter imports from, as (archive name, path) pairs.

A virtual environment (``sys.prefix != sys.base_prefix``) is staged as ``env/`` (its site-packages; the staged
``pyvenv.cfg`` and ``bin/pythonX.Y`` link are written on the node) plus ``base/``: the base interpreter's
standard library with ``lib-dynload``, its C headers, and its site-packages only when the venv includes the
system site-packages. A conda environment (``conda-meta/`` in the prefix) is staged whole as ``base/`` (minus
``pkgs/``, ``conda-meta/`` and the stdlib test suite), interpreter and shared libraries included. Anything else
(a system Python) is refused: its prefix is the operating system's.

What stays shared: the base interpreter binary and ``libpython`` of a venv (one exec and one mmap per rank), the
source folders of editable installs and other ``.pth`` paths outside the environment, ``PYTHONPATH`` entries.
"""

from __future__ import annotations

import hashlib
import json
import ast
import os
import stat
import sys
from dataclasses import dataclass, field

from sprite.errors import UsageError

# Never imported when a script starts: the stdlib's own test suite and build files, conda's package cache.
SKIP_STDLIB = ("test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3")


@dataclass(frozen=True)
class Source:
    """The roots to stage: ``roots`` maps an archive prefix to a folder, ``skip`` holds folder paths left out."""

    kind: str  # venv | conda
    version: str  # "3.11"
    roots: tuple[tuple[str, str], ...]
    skip: frozenset = frozenset()
    base_executable: str = ""  # what the staged venv's bin/pythonX.Y links to (stays shared)
    system_site: bool = False
    shared: tuple[str, ...] = ()  # paths on sys.path outside the staged roots: they stay where they are
    files: list = field(default_factory=list, compare=False, repr=False)  # (name, path, lstat), by walk()

    def manifest(self) -> dict:
        return {"kind": self.kind, "version": self.version, "base_executable": self.base_executable,
                "system_site": self.system_site}


def current() -> Source:
    """The environment of this interpreter (the one ``sprite run`` starts the ranks with).

    Raises UsageError for a Python that is neither a venv nor a conda environment.
    """
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    lib = f"lib/python{version}"
    prefix, base = os.path.realpath(sys.prefix), os.path.realpath(sys.base_prefix)
    if prefix != base:
        system_site = _venv_setting(prefix, "include-system-site-packages") == "true"
        roots = [("env/lib", os.path.join(prefix, "lib"))]
        if os.path.isdir(os.path.join(prefix, "lib64")) and not os.path.islink(os.path.join(prefix, "lib64")):
            roots.append(("env/lib64", os.path.join(prefix, "lib64")))
        roots += [(f"base/{lib}", os.path.join(base, lib)), ("base/include", os.path.join(base, "include"))]
        skip = {os.path.join(base, lib, name) for name in SKIP_STDLIB}
        if not system_site:
            skip.add(os.path.join(base, lib, "site-packages"))
        skip |= {os.path.join(base, lib, name) for name in _listdir(os.path.join(base, lib))
                 if name.startswith("config-")}
        executable = os.path.realpath(getattr(sys, "_base_executable", "") or sys.executable)
        return _with_shared(Source("venv", version, tuple(roots), frozenset(skip), executable, system_site))
    if os.path.isdir(os.path.join(base, "conda-meta")):
        skip = {os.path.join(base, name) for name in ("pkgs", "conda-meta", "share", "man", "doc")}
        skip |= {os.path.join(base, lib, name) for name in SKIP_STDLIB}
        return _with_shared(Source("conda", version, (("base", base),), frozenset(skip), system_site=True))
    raise UsageError(f"--stage: this Python ({sys.executable}) is neither a virtual nor a conda environment.",
                     f"Its prefix {base} is the operating system's, which sprite does not copy.",
                     "Create a venv (python -m venv) or a conda environment for the job, or drop --stage.")


def _venv_setting(prefix: str, key: str) -> str:
    try:
        with open(os.path.join(prefix, "pyvenv.cfg"), encoding="utf-8") as cfg:
            for line in cfg:
                name, sep, value = line.partition("=")
                if sep and name.strip() == key:
                    return value.strip().lower()
    except OSError:
        pass
    return ""


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


def _with_shared(source: Source) -> Source:
    """``source`` with the paths the staged interpreter would still import from outside the copy: sys.path
    entries (PYTHONPATH, .pth lines) and the source folders of editable installs (setuptools' finder MAPPING)."""
    roots = [path for _, path in source.roots]
    here = os.path.realpath(os.getcwd())
    found = [entry for entry in filter(None, sys.path) if os.path.realpath(entry) != here
             and not entry.endswith(("/bin", "/Scripts"))]
    for _, root in source.roots:
        for folder, _dirs, files in _site_dirs(root):
            found += [path for name in files if name.startswith("__editable__") and name.endswith("_finder.py")
                      for path in _editable_paths(os.path.join(folder, name))]
    shared = tuple(dict.fromkeys(path for path in map(os.path.realpath, found)
                                 if os.path.exists(path) and not any(_inside(path, r) for r in roots)))
    return Source(source.kind, source.version, source.roots, source.skip, source.base_executable,
                  source.system_site, shared)


def _site_dirs(root: str):
    for folder, dirs, files in os.walk(root):
        if os.path.basename(folder) in ("site-packages", "dist-packages"):
            dirs[:] = []
            yield folder, dirs, files


def node_value(node):
    return getattr(node, "value", None)


def _editable_paths(finder: str) -> list[str]:
    """The folders an editable install's finder maps its packages to (its literal ``MAPPING``)."""
    try:
        with open(finder, encoding="utf-8") as text:
            tree = ast.parse(text.read())
    except (OSError, SyntaxError, ValueError):
        return []
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) \
            else []
        if node_value(node) is not None and any(getattr(t, "id", "") == "MAPPING" for t in targets):
            try:
                return [os.path.dirname(p) if p.endswith("__init__.py") else p
                        for p in ast.literal_eval(node_value(node)).values()]
            except ValueError:
                return []
    return []


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def walk(source: Source) -> list[tuple[str, str, os.stat_result]]:
    """Every file, folder and symlink to pack as (archive name, path, lstat), in a fixed order; no symlink is
    followed. Skipped folders and unreadable entries are left out."""
    out = []
    for prefix, root in source.roots:
        if not os.path.isdir(root):
            continue
        for folder, dirs, files in os.walk(root):
            dirs[:] = sorted(d for d in dirs if os.path.join(folder, d) not in source.skip)
            rel = os.path.relpath(folder, root)
            name = prefix if rel == "." else f"{prefix}/{rel}"
            out.append((name, folder, os.lstat(folder)))
            for entry in sorted(files + [d for d in dirs if os.path.islink(os.path.join(folder, d))]):
                path = os.path.join(folder, entry)
                try:
                    out.append((f"{name}/{entry}", path, os.lstat(path)))
                except OSError:
                    continue
            dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(folder, d))]
    return out


def fingerprint(source: Source, files: list) -> str:
    """The cache key: SHA-256 over the manifest and every entry's name, size, mtime, mode and link target.
    A file rewritten with the same size and the same mtime in nanoseconds would not change it (pip writes
    new mtimes). Folders count by name and mode only."""
    digest = hashlib.sha256(json.dumps(source.manifest(), sort_keys=True).encode())
    for name, path, st in files:
        link = os.readlink(path) if stat.S_ISLNK(st.st_mode) else ""
        mtime = 0 if stat.S_ISDIR(st.st_mode) else st.st_mtime_ns  # a folder's changes show in its files
        digest.update(f"{name}\0{st.st_size}\0{mtime}\0{st.st_mode}\0{link}\n".encode(errors="replace"))
    return digest.hexdigest()
