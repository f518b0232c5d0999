. .whl/gpu_setup.sh
F=$REPO/tests/scripts/fit_faults.py
echo "== 1: killed rank, --retries 1, resume on 2 GPUs (NCCL)"
sprite run --devices 2 --retries 1 --run-dir R1 $F --kill-rank 1 --kill-step 5 --marker $PWD/killed --checkpoint-dir $PWD/ck > r1.log 2>&1; echo "exit $?"
grep -E "sprite:|finished at step|kills itself|backend|nccl|NCCL|cuda" r1.log | grep -v Warning | head -20
sprite runs verify R1; echo "verify exit $?"; sprite runs R1/.. 2>&1 | tail -3
python3 -c "
import json; rs=[json.loads(l) for l in open('R1/audit.jsonl')]
print([(r['kind'], r.get('exit_code'), r.get('cause'), r.get('resume'), r.get('step')) for r in rs])"
sprite ckpt list ck | head -12
echo "== 2: stall watchdog, rank 1 sleeps at step 3, --stall-timeout 20"
start=$(date +%s); sprite run --devices 2 --stall-timeout 20 --run-dir R2 $F --sleep-rank 1 --sleep-step 3 > r2.log 2>&1; echo "exit $? after $(( $(date +%s) - start )) s"
grep "sprite:" r2.log | tail -3; ps aux | grep -c "[s]prite.runtime"
cp r1.log r2.log R1/audit.jsonl $OUT/ 2>/dev/null
