"""`sprite preflight`: every node of the allocation checked in parallel before a long run (issue 28)."""
