. .whl/gpu_setup.sh
mkdir -p $W/pd; REPO=$REPO PROBE_TMP=$W/pd timeout 300 python3 -m torch.distributed.run --nproc-per-node 2 $REPO/.whl/probe_plan.py 2>&1 | grep -v -i warn > $OUT/probe_plan.txt; grep -a "save\|sprite \|cached \|mismatch\|Planner\|Error" $OUT/probe_plan.txt | tail -8; echo "t=$SECONDS"
