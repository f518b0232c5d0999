"""Job scripts and their submission through the scheduler clients."""
