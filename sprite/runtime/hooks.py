"""How sprite hooks into Lightning and torch classes: wrap a method once; act when a module is first imported."""

from __future__ import annotations

import contextlib
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
    """Another finder's loader: the module executes inside ``during(name)``, then ``after()`` runs. The module's
    ``__loader__`` and its spec's loader are the original one again before it executes, so nothing inside sees
    this wrapper."""

    def __init__(self, loader, after, during=lambda name: contextlib.nullcontext()) -> None:
        self.loader, self.after, self.during = loader, after, during

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        module.__loader__ = self.loader
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self.loader
        with self.during(module.__name__):
            self.loader.exec_module(module)
        self.after()


class _Finder(importlib.abc.MetaPathFinder):
    """Asks the finders after it for a module ``wants(name)`` accepts and puts ``wrap(loader)`` in place of the
    loader they return (the pattern of wrapt's post-import hooks, without the dependency: the device machines
    install sprite without its dependencies' extras)."""

    def __init__(self, wants, wrap) -> None:
        self.wants, self.wrap, self._busy = wants, wrap, False

    def find_spec(self, name, path, target=None):
        if self._busy or not self.wants(name):
            return None
        self._busy = True
        try:
            spec = importlib.util.find_spec(name)  # the other finders (this one says no while busy)
        finally:
            self._busy = False
        if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = self.wrap(spec.loader)
        return spec


_executing: list[str] = []  # modules of a waited-for prefix whose bodies run now, outermost first
_held: list = []  # callbacks fired while one of them ran: they run once the outermost has finished


@contextlib.contextmanager
def _executing_one(name: str):
    _executing.append(name)
    try:
        yield
    finally:
        _executing.pop()


def _release_held() -> None:
    while _held and not _executing:
        _held.pop(0)()


class _AfterImport(_Finder):
    """Chains ``callback`` to the loader of module ``name`` (held while a waited-for module executes)."""

    def __init__(self, name: str, callback) -> None:
        super().__init__(lambda module: module == name and not self.fired, lambda loader: _Then(loader, self.fire))
        self.callback, self.fired = callback, False

    def fire(self) -> None:
        if self.fired:
            return
        self.fired = True
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        if _executing:
            _held.append(self.callback)
        else:
            self.callback()


class _WaitFor(_Finder):
    """While a module whose name starts with ``prefix`` executes, callbacks of :func:`after_import` wait."""

    def __init__(self, prefix: str) -> None:
        super().__init__(lambda module: module.startswith(prefix),
                         lambda loader: _Then(loader, _release_held, _executing_one))
        self.prefix = prefix


def after_import(name: str, callback, wait_for: str = "") -> None:
    """Call ``callback()`` once module ``name`` is imported: now when it already is (a rank forked from a warm
    supervisor), else right after the first import of it has executed the module, before that import statement
    goes on; a script that never imports it never pays for it. An exception from ``callback`` fails that import
    statement.

    ``wait_for``, a module prefix (``"sprite.runtime."``): when the first import of ``name`` comes from the body of
    such a module, ``callback`` waits until the outermost of them has finished, so that it imports that module
    whole instead of finding it half-made (a circular import: sprite's strategy modules import Lightning, and the
    callback that wraps Lightning imports them)."""
    if wait_for and not any(isinstance(finder, _WaitFor) and finder.prefix == wait_for for finder in sys.meta_path):
        sys.meta_path.insert(0, _WaitFor(wait_for))
    if name in sys.modules:
        callback()
        return
    sys.meta_path.insert(0, _AfterImport(name, callback))
