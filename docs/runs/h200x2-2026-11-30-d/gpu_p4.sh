. .whl/gpu_setup.sh
mkdir -p $W/pd; REPO=$REPO PROBE_TMP=$W/pd timeout 400 python3 -m torch.distributed.run --nproc-per-node 2 $REPO/.whl/probe_dcp.py 2>&1 | grep -v -i warn | tail -16; echo "t=$SECONDS"
