set -x
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python -c "import torch, lightning, mpi4py; print(torch.__version__, lightning.__version__, mpi4py.__version__)"
pip install -q --no-index --no-deps --target /tmp/new build/whl/*.whl
pip install -q --no-index --no-deps --target /tmp/old build/whl_old/*.whl build/whl/python_hostlist*.whl build/whl/py_spy*.whl
export HF_HUB_OFFLINE=1
# who takes SIGUSR1 when mpi4py.MPI is imported (Open MPI singleton init)
python - <<'PY' > $OUT/mpi4py_sigusr1.txt 2>&1
import ctypes, signal
libc = ctypes.CDLL(None)
class SA(ctypes.Structure):
    _fields_ = [("h", ctypes.c_void_p), ("m", ctypes.c_ulong * 16), ("f", ctypes.c_int), ("r", ctypes.c_void_p)]
def lib():
    sa = SA(); libc.sigaction(signal.SIGUSR1, None, ctypes.byref(sa))
    for line in open("/proc/self/maps"):
        p = line.split(); lo, hi = (int(x, 16) for x in p[0].split("-"))
        if sa.h and lo <= sa.h < hi: return hex(sa.h), p[-1]
    return hex(sa.h or 0), "-"
got = []
signal.signal(signal.SIGUSR1, lambda *a: got.append(1))
print("before mpi4py.MPI:", lib())
from mpi4py import MPI
print("after  mpi4py.MPI:", lib(), MPI.Get_library_version().splitlines()[0])
import os, time
os.kill(os.getpid(), signal.SIGUSR1); time.sleep(0.5)
print("python handler ran after a self-sent SIGUSR1:", bool(got))
PY
cat $OUT/mpi4py_sigusr1.txt
for v in old new; do
  PYTHONPATH=/tmp/$v PATH=/tmp/$v/bin:$PATH timeout 240 python build/diag/drive.py cuda1-$v,cuda > $OUT/diag_$v.txt 2>&1
  cut -c1-400 $OUT/diag_$v.txt
done
mkdir -p /tmp/b && cp -r benchmarks tests /tmp/b/
cd /tmp/b && PYTHONPATH=/tmp/new PATH=/tmp/new/bin:$PATH timeout 400 python benchmarks/preempt_resume.py --accelerator cuda --devices 1 > $OUT/preempt_resume_1gpu_fixed.txt 2>&1
echo rc=$? >> $OUT/preempt_resume_1gpu_fixed.txt
cat $OUT/preempt_resume_1gpu_fixed.txt
