. .whl/gpu_setup.sh
( CUDA_VISIBLE_DEVICES=0 OMP_NUM_THREADS=8 timeout 555 taskset -c 4-11 sprite bench --model qwen2.5-0.5b-shape --seq 512 --precision bf16-mixed --sweep 1 --warmup 10 --steps 40 --batch 8 --baseline lightning --repeats 8 --out $W/p1 > $OUT/bench_w1_pairs8.txt 2>&1; echo "exit $?" >> $OUT/bench_w1_pairs8.txt; cp $W/p1/bench.json $OUT/bench_w1_pairs8.json )
grep -v "^\s*$" $OUT/bench_w1_pairs8.txt | tail -14; echo "t=$SECONDS"
