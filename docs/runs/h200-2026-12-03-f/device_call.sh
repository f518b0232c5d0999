# $1: torch's async checkpointer types ("thread process"); the cadences follow
set -u
MODES=$1; shift
pip install -q --no-index --no-deps --target /tmp/s build/whl/*.whl 2>&1 | grep -v WARNING
export PYTHONPATH=/tmp/s HF_HUB_OFFLINE=1 PATH=/tmp/s/bin:$PATH
mkdir -p /tmp/b && cp benchmarks/checkpoint_io.py /tmp/b/ && cd /tmp/b
R=$OUT/ckpt_steps_cadence.txt
{
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; nproc; python -c "import torch, lightning; print(torch.__version__, lightning.__version__)"
df -h /tmp | tail -1
for E in "$@"; do
 for MODE in $MODES; do
  echo "--- every $E, $((4 * E)) steps, repeats 2, mode $MODE"
  ( time timeout 290 python checkpoint_io.py --model qwen2.5-0.5b-shape --devices 1 --accelerator cuda --repeats 2 \
      --modes $MODE --steps-only --steps $((4 * E)) --every $E ) 2>&1 | grep -E "^step time|^real|rror|Trace" | tail -8
 done
done
} > $R 2>&1
cat $R
