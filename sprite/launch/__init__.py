"""The plan (world, launcher argv, rendezvous, rank output) and its execution, the local supervisor."""
