. .whl/gpu_setup.sh
( timeout 150 python3 $REPO/benchmarks/preempt_resume.py --accelerator cuda --devices 2 --steps 200 --stop-at 117 > $OUT/preempt_resume_nccl_fixed.txt 2>&1; echo "exit $?" >> $OUT/preempt_resume_nccl_fixed.txt )
tail -4 $OUT/preempt_resume_nccl_fixed.txt; echo "t=$SECONDS"
timeout 250 sprite bench --model qwen2.5-0.5b-shape --batch 8 --seq 512 --precision bf16-mixed --sweep 1 --baseline raw --baseline lightning --repeats 2 --warmup 10 --steps 40 --out $W/b1 > $OUT/bench_w1.txt 2>&1; echo "exit $?" >> $OUT/bench_w1.txt
cp $W/b1/bench.json $OUT/ 2>/dev/null; grep -v "^\s*$" $OUT/bench_w1.txt | tail -25; echo "t=$SECONDS"
