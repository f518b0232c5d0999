. .whl/gpu_setup.sh
B="sprite bench --model qwen2.5-0.5b-shape --seq 512 --precision bf16-mixed --sweep 1 --warmup 10 --steps 40"
( CUDA_VISIBLE_DEVICES=0 timeout 540 $B --batch 8 --baseline raw --baseline lightning --repeats 4 --out $W/b8 > $OUT/bench_b8_r4.txt 2>&1; echo "exit $?" >> $OUT/bench_b8_r4.txt; cp $W/b8/bench.json $OUT/bench_b8_r4.json ) &
( CUDA_VISIBLE_DEVICES=1 timeout 250 $B --batch 32 --baseline raw --repeats 2 --out $W/b32 > $OUT/bench_b32.txt 2>&1; echo "exit $?" >> $OUT/bench_b32.txt; cp $W/b32/bench.json $OUT/bench_b32.json
  CUDA_VISIBLE_DEVICES=1 timeout 290 $B --batch 8 --compile --baseline raw --repeats 2 --out $W/bc > $OUT/bench_b8_compile.txt 2>&1; echo "exit $?" >> $OUT/bench_b8_compile.txt; cp $W/bc/bench.json $OUT/bench_b8_compile.json ) &
wait
for f in $OUT/bench_*.txt; do echo "== $f"; grep -v "^\s*$" $f | tail -14; done; echo "t=$SECONDS"
