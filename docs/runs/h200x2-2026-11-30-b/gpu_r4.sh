. .whl/gpu_setup.sh
nproc
( OMP_NUM_THREADS=8 timeout 500 taskset -c 4-11 sprite bench --model qwen2.5-0.5b-shape --seq 512 --precision bf16-mixed --sweep 1 --warmup 10 --steps 40 --batch 8 --baseline raw --baseline lightning --repeats 3 --out $W/p1 > $OUT/bench_w1_pinned.txt 2>&1; echo "exit $?" >> $OUT/bench_w1_pinned.txt; cp $W/p1/bench.json $OUT/bench_w1_pinned.json )
grep -v "^\s*$" $OUT/bench_w1_pinned.txt | tail -12 | head -8; echo "t=$SECONDS"
