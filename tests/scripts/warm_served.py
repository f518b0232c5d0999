"""What a rank run by ``python -m sprite.runtime`` has, written to OUT/probe.json (tests/test_warmserver.py).

    warm_served.py OUT [exit3 | kill | usr1 | sleep]

The record: pid, argv, cwd, umask, RLIMIT_NOFILE, CPU affinity, torch's threads, whether SIGHUP is ignored, the
text read from the descriptor PROBE_FD names, and whether Lightning was imported before the script. Then: exit 3,
SIGKILL itself, wait for SIGUSR1 (writing OUT/usr1 when it comes), or sleep a minute.
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
signal.signal(signal.SIGUSR1, lambda signum, frame: got.append(signum))
with open(os.path.join(out, "probe.json.part"), "w") as f:
    json.dump(record, f)
os.rename(os.path.join(out, "probe.json.part"), os.path.join(out, "probe.json"))
if then == "exit3":
    sys.exit(3)
if then == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
if then == "usr1":
    deadline = time.monotonic() + 60
    while not got and time.monotonic() < deadline:
        time.sleep(0.05)
    if got:
        open(os.path.join(out, "usr1"), "w").close()
if then == "sleep":
    time.sleep(60)
