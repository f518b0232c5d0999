pip install -q --no-index --no-deps --target /tmp/sn build/whl/*.whl 2>&1 | grep -v WARNING
pip install -q --no-index --no-deps --target /tmp/so build/whl_old/*.whl build/whl/python_hostlist*.whl 2>&1 | grep -v WARNING
export HF_HUB_OFFLINE=1
nproc > $OUT/harness_startup_16cores.txt
for tree in new old new old; do
  echo "== $tree ($( [ $tree = new ] && echo 3d7fd2e || echo 9b1b59f ))"
  PYTHONPATH=/tmp/s${tree:0:1} timeout 280 python benchmarks/harness_startup.py --sprite "python -m sprite" --no-fresh --repeats 2 2>&1 | grep "baseline\|ratio\|of which\|exited"
done >> $OUT/harness_startup_16cores.txt 2>&1
cat $OUT/harness_startup_16cores.txt
