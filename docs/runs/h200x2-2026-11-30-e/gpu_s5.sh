. .whl/gpu_setup.sh
mkdir -p $W/pd; REPO=$REPO PROBE_TMP=$W/pd timeout 300 python3 -m torch.distributed.run --nproc-per-node 2 $REPO/.whl/probe_save.py 2>&1 | grep -v -i warn > $OUT/probe_save.txt; grep -a "save\|Error" $OUT/probe_save.txt | tail -5; echo "t=$SECONDS"
