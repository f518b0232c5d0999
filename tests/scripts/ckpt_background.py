"""tests/scripts/ckpt_fit.py with its background checkpoint writes made slow, failing or preempted, for
tests/test_ckpt_background.py. Environment (read in every rank):
- CKPT_SLOW: seconds each background write of a full-state file sleeps first (a slow file system);
- CKPT_FAIL_AT: the K-th background write (counted in this process) fails with ENOSPC (a full disk);
- CKPT_SIGNAL_AT: the K-th background write sends this process SIGUSR1 (sprite's preemption signal) first, so the
  preemption arrives while that save is in flight;
- CKPT_FAIL_SHARDS_AT=R:K: rank R's K-th write of its shard files (a sharded save, torch's writer) fails with ENOSPC,
  while the other ranks write theirs.
"""

import errno
import os
import runpy
import signal
import time
from pathlib import Path

from sprite.runtime.ckpt import save as hashed_save

_real, _count = hashed_save._write_temp, [0]


def _write_temp(checkpoint, temp, fsync):
    _count[0] += 1
    if _count[0] == int(os.environ.get("CKPT_SIGNAL_AT", "0")):
        os.kill(os.getpid(), signal.SIGUSR1)
    time.sleep(float(os.environ.get("CKPT_SLOW", "0")))
    if _count[0] == int(os.environ.get("CKPT_FAIL_AT", "0")):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(temp))
    return _real(checkpoint, temp, fsync)


hashed_save._write_temp = _write_temp

_shards_at, _shard_count = os.environ.get("CKPT_FAIL_SHARDS_AT", ""), [0]
if _shards_at and _shards_at.split(":")[0] == os.environ.get("RANK"):
    from sprite.runtime.ckpt import dcp_write

    _real_shards = dcp_write.Writer.write_data

    def write_data(self, plan, planner):
        _shard_count[0] += 1
        if _shard_count[0] == int(_shards_at.split(":")[1]):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.fs.concat_path(self.path, "__shards")))
        return _real_shards(self, plan, planner)

    dcp_write.Writer.write_data = write_data
runpy.run_path(str(Path(__file__).with_name("ckpt_fit.py")), run_name="__main__")
