"""The harness of `sprite parity`: arms, recording, the criterion's checks and the report."""
