# the final tree on one H200: a CUDA FSDP fit with background saves every 2 s under the stall watchdog, its trail verified
set -u
pip install -q --no-index --no-deps --target /tmp/s build/whl/*.whl 2>&1 | grep -v WARNING
python -c "import typer" 2>/dev/null || pip install -q --no-index --no-deps --target /tmp/s build/whl2/*.whl 2>&1 | grep -v WARNING
export PYTHONPATH=/tmp/s HF_HUB_OFFLINE=1 PATH=/tmp/s/bin:$PATH
python -c "import typer, click, rich; print('typer', typer.__version__)" > $OUT/typer.txt 2>&1
R=$OUT/final.txt
mkdir -p /tmp/f && cp examples/train.py /tmp/f/ && cd /tmp/f
{
nvidia-smi --query-gpu=name --format=csv,noheader
python -c "import torch, lightning; print(torch.__version__, lightning.__version__)"
timeout 200 sprite run --devices 1 --accelerator cuda --strategy fsdp --checkpoint-every 2s --stall-timeout 60 \
  --run-dir /tmp/f/run train.py --max-steps 60 2>&1 | tail -6; echo "run exit=${PIPESTATUS[0]}"
sprite runs verify /tmp/f/run; echo "verify exit=$?"
sprite ckpt list /tmp/f/checkpoints 2>&1 | tail -5
timeout 60 sprite run --devices 1 --accelerator cuda --stall-timeout 60 --first-step-timeout 30 train.py; echo "short allowance exit=$?"
} > $R 2>&1
cat $R
