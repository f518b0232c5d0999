. .whl/gpu_setup.sh
mkdir -p $W/pd; REPO=$REPO PROBE_TMP=$W/pd timeout 300 python3 -m torch.distributed.run --nproc-per-node 2 $REPO/.whl/probe_read.py 2>&1 | grep -v -i warn > $OUT/probe_read.txt; grep -a "threads\|Error" $OUT/probe_read.txt; echo "t=$SECONDS"
