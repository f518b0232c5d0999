"""Package data: conf/ (installed as sprite.conf)."""
