"""The harness of `sprite ckpt-check`: roles, faults, the fit, the judge and the report."""
