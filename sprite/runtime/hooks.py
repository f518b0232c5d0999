"""How sprite hooks into Lightning and torch classes: wrap a method once; act when a module is first imported."""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import sys


def wrap(cls, name: str, wrapper) -> None:
    """Replace ``cls.name`` by ``wrapper(original, self, *args, **kwargs)``; a second call changes nothing."""
    original = getattr(cls, name)
    if getattr(original, "_sprite_wrapped", False):
        return

    @functools.wraps(original)
    def method(self, *args, **kwargs):
        return wrapper(original, self, *args, **kwargs)

    method._sprite_wrapped = True
    setattr(cls, name, method)


class _Then(importlib.abc.Loader):
    """Another finder's loader, followed by ``after()`` once the module has executed. The module's ``__loader__``
    and its spec's loader are the original one again before it executes, so nothing inside sees this wrapper."""

    def __init__(self, loader, after) -> None:
        self.loader, self.after = loader, after

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        module.__loader__ = self.loader
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        self.after()


class _AfterImport(importlib.abc.MetaPathFinder):
    """Asks the finders after it for ``name`` and chains ``callback`` to the loader they return (the pattern of
    wrapt's post-import hooks, without the dependency: the device machines install sprite without its
    dependencies' extras)."""

    def __init__(self, name: str, callback) -> None:
        self.name, self.callback, self.fired, self._busy = name, callback, False, False

    def find_spec(self, name, path, target=None):
        if name != self.name or self.fired or self._busy:
            return None
        self._busy = True
        try:
            spec = importlib.util.find_spec(name)  # the other finders (this one says no while busy)
        finally:
            self._busy = False
        if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _Then(spec.loader, self.fire)
        return spec

    def fire(self) -> None:
        if self.fired:
            return
        self.fired = True
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        self.callback()


def after_import(name: str, callback) -> None:
    """Call ``callback()`` once module ``name`` is imported: now when it already is (a rank forked from a warm
    supervisor), else right after the first import of it has executed the module, before that import statement
    goes on; a script that never imports it never pays for it. An exception from ``callback`` fails that import
    statement."""
    if name in sys.modules:
        callback()
        return
    sys.meta_path.insert(0, _AfterImport(name, callback))
