# each argument: "MODE EXTRA-FLAGS..." for one run of the step-time comparison at every $EVERY
set -u
EVERY=${EVERY:-10} REPEATS=${REPEATS:-2} LIMIT=${LIMIT:-200} STEPS=${STEPS:-40} BATCH=${BATCH:-2} SEQ=${SEQ:-8}
pip install -q --no-index --no-deps --target /tmp/s build/whl/*.whl 2>&1 | grep -v WARNING
export PYTHONPATH=/tmp/s HF_HUB_OFFLINE=1 PATH=/tmp/s/bin:$PATH
mkdir -p /tmp/b && cp benchmarks/checkpoint_io.py /tmp/b/ && cd /tmp/b
R=$OUT/ckpt_steps_variants.txt
{
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; nproc; python -c "import torch, lightning; print(torch.__version__, lightning.__version__)"
for V in "$@"; do
  set -- $V; MODE=$1; shift
  echo "--- every $EVERY, $STEPS steps, batch $BATCH x $SEQ, repeats $REPEATS, mode $MODE, flags: $*"
  ( time timeout $LIMIT python checkpoint_io.py --model qwen2.5-0.5b-shape --devices 1 --accelerator cuda --repeats $REPEATS \
      --modes $MODE --steps-only --steps $STEPS --every $EVERY --batch $BATCH --seq $SEQ "$@" ) 2>&1 | grep -E "^step time|^real|rror|Trace" | tail -8
  nvidia-smi --query-gpu=memory.used --format=csv,noheader
done
} > $R 2>&1
cat $R
