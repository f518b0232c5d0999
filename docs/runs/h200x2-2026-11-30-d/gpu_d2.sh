. .whl/gpu_setup.sh
for t in 1 4; do
( timeout 280 python3 $REPO/benchmarks/checkpoint_io.py --model qwen2.5-0.5b-shape --devices 2 --accelerator cuda --repeats 3 --dcp-threads $t > $OUT/checkpoint_io_h200x2_d_t$t.txt 2>&1; echo "exit $?" >> $OUT/checkpoint_io_h200x2_d_t$t.txt )
tail -4 $OUT/checkpoint_io_h200x2_d_t$t.txt; echo "t=$SECONDS"
done
