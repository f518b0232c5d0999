. .whl/gpu_setup.sh
nproc; df -hT $W | tail -1
( timeout 420 python3 $REPO/benchmarks/checkpoint_io.py --model qwen2.5-0.5b-shape --devices 2 --accelerator cuda --repeats 3 > $OUT/checkpoint_io_h200x2_d.txt 2>&1; echo "exit $?" >> $OUT/checkpoint_io_h200x2_d.txt )
tail -4 $OUT/checkpoint_io_h200x2_d.txt; echo "t=$SECONDS"
