# a sharded fit on CUDA saving every 2 s (sprite's state dicts from the 2nd save on), then a resume from its newest
set -u
pip install -q --no-index --no-deps --target /tmp/s build/whl/*.whl 2>&1 | grep -v WARNING
export PYTHONPATH=/tmp/s HF_HUB_OFFLINE=1 PATH=/tmp/s/bin:$PATH
R=$OUT/fit_and_resume.txt
mkdir -p /tmp/e && cp examples/train.py /tmp/e/ && cd /tmp/e
{
python -c "import torch, lightning; print(torch.__version__, lightning.__version__)"
for RUN in a b; do
  EXTRA=""; [ $RUN = b ] && EXTRA="--resume auto"
  echo "--- sprite run --devices 1 --strategy fsdp --accelerator cuda --checkpoint-every 2s --run-dir run-$RUN $EXTRA train.py --max-steps $([ $RUN = a ] && echo 3000 || echo 4500)"
  timeout 200 python -m sprite run --devices 1 --strategy fsdp --accelerator cuda --checkpoint-every 2s --run-dir run-$RUN \
    $EXTRA train.py --max-steps $([ $RUN = a ] && echo 3000 || echo 4500) > run-$RUN.out 2>&1; echo "exit $?"
  grep -E "resume:|final loss|succeeded|rror" run-$RUN.out | grep -v INFO | tail -4
  python - run-$RUN/audit.jsonl <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r.get("kind") == "checkpoint_written":
        print("saved", r["path"].rsplit("/", 1)[-1], "writer", r.get("writer"), "stall_seconds", r.get("stall_seconds"))
PY
  python -m sprite ckpt list checkpoints 2>&1 | tail -7
done
} > $R 2>&1
cat $R
