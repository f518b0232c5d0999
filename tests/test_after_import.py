"""sprite.runtime.hooks.after_import: the runtime wraps Lightning right after the script imports it, and never
imports it for a script that does not (tests/test_any_script.py checks the latter in real launches)."""

from __future__ import annotations

import importlib
import sys

import pytest

from sprite.runtime import hooks


def _module(tmp_path, monkeypatch, name: str) -> None:
    (tmp_path / f"{name}.py").write_text("VALUE = 'set by the module'\nDONE = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, name, raising=False)


def test_the_callback_runs_once_after_the_module_executed_and_before_the_import_statement_goes_on(
        tmp_path, monkeypatch):
    _module(tmp_path, monkeypatch, "sprite_after_probe")
    calls = []

    def callback():
        module = sys.modules["sprite_after_probe"]
        calls.append(module.DONE)  # the whole module ran first
        module.VALUE = "changed by the callback"

    hooks.after_import("sprite_after_probe", callback)
    assert calls == []  # nothing imported it yet
    from sprite_after_probe import VALUE  # noqa: E402

    assert calls == [True] and VALUE == "changed by the callback"
    importlib.reload(sys.modules["sprite_after_probe"])
    assert calls == [True]  # once
    loader = sys.modules["sprite_after_probe"].__loader__
    assert type(loader).__name__ == "SourceFileLoader" and sys.modules["sprite_after_probe"].__spec__.loader is loader
    assert not any(isinstance(finder, hooks._AfterImport) for finder in sys.meta_path)


def test_a_module_already_imported_gets_the_callback_at_once(tmp_path, monkeypatch):
    _module(tmp_path, monkeypatch, "sprite_after_early")
    import sprite_after_early  # noqa: F401

    calls = []
    hooks.after_import("sprite_after_early", lambda: calls.append("now"))
    assert calls == ["now"]


def test_a_failing_callback_fails_the_import_statement(tmp_path, monkeypatch):
    _module(tmp_path, monkeypatch, "sprite_after_fails")

    def callback():
        raise RuntimeError("sprite could not wrap it")

    hooks.after_import("sprite_after_fails", callback)
    with pytest.raises(RuntimeError, match="could not wrap"):  # never a script running without sprite's wrapping
        import sprite_after_fails  # noqa: F401


def test_a_callback_that_imports_the_module_importing_its_target_waits_until_that_module_is_whole(
        tmp_path, monkeypatch):
    """The runtime's wrapping of Lightning imports sprite's strategy modules, which import Lightning: when the
    first import of the target comes from such a module's body, the callback waits for that module (wait_for),
    instead of failing on it half-made. Without wait_for the same import fails (a circular import)."""
    package = tmp_path / "sprite_wait_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "strategy.py").write_text("import sprite_wait_target\nclass Strategy:\n    pass\n")
    (tmp_path / "sprite_wait_target.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    finders = list(sys.meta_path)
    monkeypatch.setattr(sys, "meta_path", finders)  # the finders added here go with the test
    seen = []

    def callback():  # as _prepare_lightning: it needs the strategy class whole
        from sprite_wait_pkg.strategy import Strategy

        seen.append(Strategy.__name__)

    for waits in (False, True):
        for name in ("sprite_wait_pkg", "sprite_wait_pkg.strategy", "sprite_wait_target"):
            monkeypatch.delitem(sys.modules, name, raising=False)
        hooks.after_import("sprite_wait_target", callback, wait_for="sprite_wait_pkg." if waits else "")
        if not waits:
            with pytest.raises(ImportError, match="partially initialized"):
                import sprite_wait_pkg.strategy  # noqa: F401
            assert seen == []
        else:
            import sprite_wait_pkg.strategy  # noqa: F401,F811

            assert seen == ["Strategy"] and hooks._held == [] and hooks._executing == []
