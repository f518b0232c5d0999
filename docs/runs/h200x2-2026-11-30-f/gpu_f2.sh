. .whl/gpu_setup.sh
export PROBE_TMP=$(mktemp -d) REPO
timeout 300 torchrun --nproc-per-node 2 $REPO/.whl/probe_write.py 2>&1 | grep -v Warning | grep -v "return func" | tee $OUT/probe_write_h200x2.txt | tail -8
echo "t=$SECONDS"
