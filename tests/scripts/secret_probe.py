"""A rank that reports, without ever printing the secret, whether it sees it and whether a command line holds it.

    python -m sprite.runtime secret_probe.py NAME SHA256 [HOLD_SECONDS]

Prints ``secret-probe rank=R seen=True|False cmdlines=N`` where ``seen`` says that $NAME hashes to SHA256 and
N counts the processes on this machine whose /proc/PID/cmdline contains the value, then ``umask=0oNNN``; then
stays alive HOLD_SECONDS so the test can scan the command lines of the whole launch while it runs.
"""

import hashlib
import os
import sys
import time

name, digest = sys.argv[1], sys.argv[2]
value = os.environ.get(name, "")
seen = bool(value) and hashlib.sha256(value.encode()).hexdigest() == digest
hits = 0
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            hits += bool(value) and value.encode() in handle.read()
    except OSError:
        pass  # the process ended meanwhile
rank = next((os.environ[v] for v in ("RANK", "PMI_RANK", "SLURM_PROCID") if v in os.environ), "?")
umask = os.umask(0)
os.umask(umask)
print(f"secret-probe rank={rank} seen={seen} cmdlines={hits} umask={oct(umask)}", flush=True)
time.sleep(float(sys.argv[3]) if len(sys.argv) > 3 else 0)
