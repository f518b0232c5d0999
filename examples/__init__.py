"""Package data: examples/ (installed as sprite.examples)."""
