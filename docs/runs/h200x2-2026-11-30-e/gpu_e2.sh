. .whl/gpu_setup.sh
( timeout 300 python3 $REPO/benchmarks/checkpoint_io.py --model qwen2.5-0.5b-shape --devices 2 --accelerator cuda --repeats 3 > $OUT/checkpoint_io_h200x2_e2.txt 2>&1; echo "exit $?" >> $OUT/checkpoint_io_h200x2_e2.txt )
tail -4 $OUT/checkpoint_io_h200x2_e2.txt; echo "t=$SECONDS"
mkdir -p $W/pd; REPO=$REPO PROBE_TMP=$W/pd timeout 200 python3 -m torch.distributed.run --nproc-per-node 2 $REPO/.whl/probe_load.py 2>&1 | grep -v -i warn | sed -e 's#/usr/[^ ]*/site-packages/##; s#/tmp/[^ ]*/sprite/#sprite/#' | cut -c1-220 > $OUT/probe_load.txt; grep -a "medians\|mismatch\|has transforms" $OUT/probe_load.txt; echo "t=$SECONDS"
