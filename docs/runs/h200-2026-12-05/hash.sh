# step time at a save every 10 steps with each rank hashing on 14 (sprite's pick here), 8 and 4 threads, alternated
set -u
pip install -q --no-index --no-deps --target /tmp/s build/whl/*.whl 2>&1 | grep -v WARNING
export PYTHONPATH=/tmp/s HF_HUB_OFFLINE=1 PATH=/tmp/s/bin:$PATH
mkdir -p /tmp/b && cp benchmarks/checkpoint_io.py /tmp/b/ && cd /tmp/b
R=$OUT/hash_threads.txt
{
nvidia-smi --query-gpu=name --format=csv,noheader; nproc
for H in 4 0 8 4 0; do
  echo "--- hash threads $H (0: sprite's)"
  ( time timeout 170 python checkpoint_io.py --model qwen2.5-0.5b-shape --devices 1 --accelerator cuda --repeats 2 \
     --modes process --steps-only --steps 60 --every 10 --batch 2 --seq 8 --hash-threads $H ) 2>&1 | grep -E "^step time|^real|rror|Trace" | tail -4
done
} > $R 2>&1
cat $R
