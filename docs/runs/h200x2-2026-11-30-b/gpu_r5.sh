. .whl/gpu_setup.sh
( timeout 170 python3 $REPO/benchmarks/checkpoint_io.py --model qwen2.5-0.5b-shape --devices 2 --accelerator cuda --repeats 2 > $OUT/checkpoint_io_h200x2_parts.txt 2>&1; echo "exit $?" >> $OUT/checkpoint_io_h200x2_parts.txt )
tail -4 $OUT/checkpoint_io_h200x2_parts.txt; echo "t=$SECONDS"
