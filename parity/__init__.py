"""Package data: parity/ (installed as sprite.parity)."""
