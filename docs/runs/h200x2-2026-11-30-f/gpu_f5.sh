. .whl/gpu_setup.sh
( timeout 420 python3 $REPO/benchmarks/checkpoint_io.py --model qwen2.5-0.5b-shape --devices 2 --accelerator cuda --repeats 5 > $OUT/checkpoint_io_h200x2_f5.txt 2>&1; echo "exit $?" >> $OUT/checkpoint_io_h200x2_f5.txt )
tail -4 $OUT/checkpoint_io_h200x2_f5.txt; echo "t=$SECONDS"
