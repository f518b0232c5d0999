pip install -q --no-index --no-deps --target /tmp/s build/whl/*.whl 2>&1 | grep -v WARNING
export PYTHONPATH=/tmp/s HF_HUB_OFFLINE=1 PATH=/tmp/s/bin:$PATH
mkdir -p /tmp/h && cd /tmp/h && cp $OLDPWD/examples/train.py train.py
for cmd in "parity --precision bf16-mixed" "ckpt-check" "run --devices 2 train.py" "run --devices 2 --accelerator cpu --dry-run train.py"; do
  echo "\$ sprite $cmd"; ( time timeout 120 python -m sprite $cmd ) 2>&1 | grep -v "^\[rank 0\] .*\(Warning\|warn\|Tip\|deprecated\)" | tail -25; echo "exit ${PIPESTATUS[0]}"; echo
done > $OUT/headline_1gpu_refused.txt 2>&1
echo "\$ ls -A . sprite-checks" >> $OUT/headline_1gpu_refused.txt; ls -A . sprite-checks >> $OUT/headline_1gpu_refused.txt
cat $OUT/headline_1gpu_refused.txt | cut -c1-220
