# the disk's floor on this host, then sealed against plain save + fsync and the step time at a save every 10 steps
set -u
pip install -q --no-index --no-deps --target /tmp/s build/whl/*.whl 2>&1 | grep -v WARNING
export PYTHONPATH=/tmp/s HF_HUB_OFFLINE=1 PATH=/tmp/s/bin:$PATH
mkdir -p /tmp/b && cp benchmarks/checkpoint_io.py /tmp/b/ && cd /tmp/b
R=$OUT/floor.txt
{
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader; nproc; python -c "import torch, lightning; print(torch.__version__, lightning.__version__)"
df -hT /tmp | tail -1; free -g | head -2
for i in 1 2 3; do
  sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null
  ( time dd if=/dev/zero of=/tmp/b/dd.bin bs=16M count=119 conv=fsync ) 2>&1 | grep -E "copied|real"
  rm -f /tmp/b/dd.bin
done
echo "--- sharded, process, repeats 3, save/load figures and every 10 steps of 60 (batch 2 x 8)"
( time timeout 420 python checkpoint_io.py --model qwen2.5-0.5b-shape --devices 1 --accelerator cuda --repeats 3 \
   --modes process --formats sharded --steps 60 --every 10 --batch 2 --seq 8 ) 2>&1 | grep -E "sharded|^step time|^model|^real|rror|Trace" | tail -12
} > $R 2>&1
cat $R
