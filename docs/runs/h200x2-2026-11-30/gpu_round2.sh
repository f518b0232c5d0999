. .whl/gpu_setup.sh
date; sprite env 2>&1 | tee $OUT/sprite_env.txt | head -20
sprite run --dry-run --json $REPO/examples/train.py > $OUT/dryrun.json 2>&1
mkdir -p /tmp/ck
for p in 32-true bf16-mixed; do
  setsid nohup sprite ckpt-check --devices 2 --accelerator cuda --model qwen2.5-0.5b-shape --precision $p --slots 8 --time-limit 480 --out /tmp/ck/$p > /tmp/ck/$p.txt 2>&1 < /dev/null &
done
( python3 $REPO/benchmarks/preempt_resume.py --accelerator cuda --devices 2 --steps 200 --stop-at 117 > $OUT/preempt_resume_nccl.txt 2>&1; echo "exit $?" >> $OUT/preempt_resume_nccl.txt ) &
( sprite run --log-dir $W/logs $REPO/examples/train.py --max-steps 5 > $OUT/logdir_run.txt 2>&1; echo "exit $?" >> $OUT/logdir_run.txt; ls -l $W/logs >> $OUT/logdir_run.txt ) &
while [ $SECONDS -lt 500 ] && pgrep -f "sprite ckpt-check|preempt_resume" > /dev/null; do sleep 10; done
date; nvidia-smi --query-gpu=memory.used --format=csv
cd /tmp/ck && for p in 32-true bf16-mixed; do mkdir -p $OUT/$p; cp -r $p.txt $p/run.json $p/checkpoint_report.json $p/logs $OUT/$p/ 2>/dev/null; done
grep -h "verdict\|every launch ended\|error" /tmp/ck/*.txt | head; tail -5 $OUT/preempt_resume_nccl.txt; tail -4 $OUT/logdir_run.txt
pgrep -fa "sprite ckpt-check" | head -3
