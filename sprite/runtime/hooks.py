"""How sprite hooks into Lightning and torch classes: wrap a method once."""

from __future__ import annotations

import functools


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
