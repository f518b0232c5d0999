. .whl/gpu_setup.sh
mkdir -p $W/pd; REPO=$REPO PROBE_TMP=$W/pd timeout 500 python3 -m torch.distributed.run --nproc-per-node 2 $REPO/.whl/probe_load.py 2>&1 | grep -v -i warn | sed -e 's#/usr/[^ ]*/site-packages/##; s#/tmp/[^ ]*/sprite/#sprite/#' | cut -c1-220 > $OUT/probe_load.txt; tail -5 $OUT/probe_load.txt; echo "t=$SECONDS"
