"""Example Lightning scripts shipped with sprite (installed as sprite.examples)."""
