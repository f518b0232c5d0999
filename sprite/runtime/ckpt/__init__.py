"""Checkpoints inside the ranks: seal, save, read, durability, verification, resume, RNG state."""
