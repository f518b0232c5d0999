pip install -q --no-index --no-deps --target /tmp/s build/whl/*.whl 2>&1 | grep -v WARNING
export PYTHONPATH=/tmp/s HF_HUB_OFFLINE=1
mkdir -p /tmp/h && cd /tmp/h && cp $OLDPWD/examples/train.py train.py
for cmd in "run --nodes 2 --strategy fsdp train.py" "run --nodes 1 --strategy fsdp train.py --max-steps 20"; do
  echo "\$ sprite $cmd"; ( time timeout 150 python -m sprite $cmd ) 2>&1 | grep -v "Warning\|warn(" | tail -12; echo "exit ${PIPESTATUS[0]}"; echo
done > $OUT/headline_run_1gpu.txt 2>&1
echo "\$ ls -A . sprite-runs" >> $OUT/headline_run_1gpu.txt; ls -A . sprite-runs >> $OUT/headline_run_1gpu.txt
cat $OUT/headline_run_1gpu.txt | cut -c1-250
