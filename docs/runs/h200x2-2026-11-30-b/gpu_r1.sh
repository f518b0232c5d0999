. .whl/gpu_setup.sh
nproc; df -h /tmp | tail -1
( timeout 250 python3 $REPO/benchmarks/checkpoint_io.py --model qwen2.5-0.5b-shape --devices 2 --accelerator cuda --repeats 3 > $OUT/checkpoint_io_h200x2.txt 2>&1; echo "exit $?" >> $OUT/checkpoint_io_h200x2.txt )
tail -5 $OUT/checkpoint_io_h200x2.txt; echo "t=$SECONDS"
( timeout 320 sprite ckpt-check --devices 2 --accelerator cuda --model qwen2.5-0.5b-shape --precision bf16-mixed --slots 8 --out $W/ck16 > $OUT/ckpt_bf16_console.txt 2>&1; echo "exit $?" >> $OUT/ckpt_bf16_console.txt )
cp $W/ck16/checkpoint_report.json $OUT/ckpt_bf16_report.json 2>/dev/null
grep -v "^\s*$" $OUT/ckpt_bf16_console.txt | tail -40; echo "t=$SECONDS"
