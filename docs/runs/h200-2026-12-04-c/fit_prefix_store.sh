# a sharded fit on CUDA saving every 2 s in torch's checkpoint process: did that process join the run's store?
set -u
pip install -q --no-index --no-deps --target /tmp/s build/whl/*.whl 2>&1 | grep -v WARNING
export PYTHONPATH=/tmp/s HF_HUB_OFFLINE=1 PATH=/tmp/s/bin:$PATH
R=$OUT/fit_prefix_store.txt
mkdir -p /tmp/e && cp examples/train.py /tmp/e/ && cd /tmp/e
{
python -c "import torch, lightning; print(torch.__version__, lightning.__version__)"
python -c "import inspect, torch.distributed.checkpoint._async_process_executor as m; print('DCP_USE_PREFIX_STORE read by torch:', 'DCP_USE_PREFIX_STORE' in inspect.getsource(m))"
echo "--- sprite run --devices 1 --strategy fsdp --accelerator cuda --checkpoint-every 2s --run-dir run-a train.py --max-steps 3000"
timeout 200 python -m sprite run --devices 1 --strategy fsdp --accelerator cuda --checkpoint-every 2s --run-dir run-a \
  train.py --max-steps 3000 > run-a.out 2>&1; echo "exit $?"
grep -E "final loss|succeeded|rror|checkpoint background process (on port|with prefix)" run-a.out | tail -6
python - run-a/audit.jsonl <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r.get("kind") == "checkpoint_written":
        print("saved", r["path"].rsplit("/", 1)[-1], "writer", r.get("writer"), "verified", r.get("verified"), "stall_seconds", r.get("stall_seconds"))
PY
python -m sprite ckpt list checkpoints 2>&1 | tail -5
} > $R 2>&1
cat $R
