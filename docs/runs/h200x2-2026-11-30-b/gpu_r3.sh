. .whl/gpu_setup.sh
( timeout 200 python3 $REPO/benchmarks/checkpoint_io.py --model qwen2.5-0.5b-shape --devices 2 --accelerator cuda --repeats 3 > $OUT/checkpoint_io_h200x2.txt 2>&1; echo "exit $?" >> $OUT/checkpoint_io_h200x2.txt )
tail -5 $OUT/checkpoint_io_h200x2.txt; echo "t=$SECONDS"
( timeout $((560 - SECONDS)) sprite bench --model qwen2.5-0.5b-shape --seq 512 --precision bf16-mixed --sweep 2 --warmup 10 --steps 40 --batch 8 --baseline lightning --repeats 4 --out $W/w2 > $OUT/bench_w2_r4.txt 2>&1; echo "exit $?" >> $OUT/bench_w2_r4.txt; cp $W/w2/bench.json $OUT/bench_w2_r4.json )
grep -v "^\s*$" $OUT/bench_w2_r4.txt | tail -16; echo "t=$SECONDS"
