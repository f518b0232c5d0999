pip install -q --no-index --no-deps --target /tmp/s build/whl/*.whl 2>&1 | grep -v WARNING
export PYTHONPATH=/tmp/s HF_HUB_OFFLINE=1 PATH=/tmp/s/bin:$PATH
R=$OUT/log.txt
{
python -c "import sys, atexit; print(sys.version.split()[0], 'atexit._run_exitfuncs:', atexit._run_exitfuncs)"
python -m pytest --version
echo "== tests/test_runtime_leave.py"; timeout 120 python -m pytest -q -p no:cacheprovider tests/test_runtime_leave.py 2>&1 | tail -4
mkdir -p /tmp/h && cd /tmp/h && cp $OLDPWD/examples/train.py train.py
for cmd in "parity --precision bf16-mixed" "ckpt-check" "run --devices 2 train.py"; do
  echo "\$ sprite $cmd"; timeout 60 python -m sprite $cmd 2>&1 | tail -3; echo "exit ${PIPESTATUS[0]}"
done
echo "\$ ls -A"; ls -A
echo "== bench world 1 cuda"; ( time timeout 200 python -m sprite bench --model tiny --sweep 1 --accelerator cuda --out /tmp/h/b1 ) 2>&1 | grep -v "^\[rank" | tail -22; echo "exit ${PIPESTATUS[0]}"
echo "== parity bf16 on CPU ranks"; ( time timeout 300 python -m sprite parity --precision bf16-mixed --accelerator cpu --out /tmp/h/p1 ) 2>&1 | grep -v "^\[rank" | tail -12; echo "exit ${PIPESTATUS[0]}"
} > $R 2>&1
cp -r /tmp/h/b1/bench.json /tmp/h/p1/report.json $OUT/ 2>/dev/null
cat $R
