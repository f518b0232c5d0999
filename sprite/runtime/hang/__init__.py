"""Inside every rank: the stacks and collectives a rank leaves behind when it stops advancing (issue 27).

``dump.py`` arms ``faulthandler``'s timed dump from a thread of its own and re-arms it whenever the heartbeat
moves, so a rank that stops advancing writes its stacks with no help from the launcher (under srun and mpiexec the
ranks are not sprite's children); ``recorder.py`` adds what torch's flight recorder says of its last collectives.
``sprite.recovery.hang`` reads both when the watchdog stops the run.
"""
