. .whl/gpu_setup.sh
( CUDA_VISIBLE_DEVICES=0 OMP_NUM_THREADS=8 timeout 470 taskset -c 4-11 sprite bench --model qwen2.5-0.5b-shape --seq 512 --precision bf16-mixed --sweep 1 --warmup 10 --steps 40 --batch 8 --baseline raw --repeats 6 --out $W/p2 > $OUT/bench_w1_raw_pairs8.txt 2>&1; echo "exit $?" >> $OUT/bench_w1_raw_pairs8.txt; cp $W/p2/bench.json $OUT/bench_w1_raw_pairs8.json )
grep -v "^\s*$" $OUT/bench_w1_raw_pairs8.txt | grep -v "^\[" | head -3; echo "t=$SECONDS"
