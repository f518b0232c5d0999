"""The harness of `sprite bench`: the sweep, its workers, statistics and report."""
