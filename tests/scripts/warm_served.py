"""What a rank run by ``python -m sprite.runtime`` has, written to OUT/probe.json (tests/test_warmserver.py).

    warm_served.py OUT [exit3 | kill | signals | sleep]

The record: pid, argv, cwd, umask, RLIMIT_NOFILE, CPU affinity, torch's threads, whether SIGHUP is ignored, the
text read from the descriptor PROBE_FD names, and whether Lightning was imported before the script. Then: exit 3,
SIGKILL itself, wait for any signal the stand-in passes on (writing OUT/got-NUMBER for the first that comes), or
sleep a minute.
"""

import json
import os
import resource
import signal
import sys
import time

out, then = sys.argv[1], (sys.argv[2:] or [""])[0]
lightning_before = "lightning.pytorch" in sys.modules
import torch  # noqa: E402  (after the check above)

mask = os.umask(0)
os.umask(mask)
fd = os.environ.get("PROBE_FD")
record = {"pid": os.getpid(), "argv": sys.argv[1:], "cwd": os.getcwd(), "umask": mask,
          "nofile": resource.getrlimit(resource.RLIMIT_NOFILE)[0], "affinity": sorted(os.sched_getaffinity(0)),
          "threads": torch.get_num_threads(), "hup_ignored": signal.getsignal(signal.SIGHUP) == signal.SIG_IGN,
          "fd_text": os.read(int(fd), 100).decode() if fd else None, "lightning_before": lightning_before}
got = []
if then == "signals":
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
                signal.SIGALRM):
        signal.signal(sig, lambda signum, frame: got.append(signum))
with open(os.path.join(out, "probe.json.part"), "w") as f:
    json.dump(record, f)
os.rename(os.path.join(out, "probe.json.part"), os.path.join(out, "probe.json"))
if then == "exit3":
    sys.exit(3)
if then == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
if then == "signals":
    deadline = time.monotonic() + 60
    while not got and time.monotonic() < deadline:
        time.sleep(0.05)
    if got:
        open(os.path.join(out, f"got-{got[0]}"), "w").close()
if then == "sleep":
    time.sleep(60)
