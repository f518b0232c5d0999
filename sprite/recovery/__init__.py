"""Recovery of long runs: the stall watchdog, attempt classification, relaunch policy and the attempt loop."""
