. .whl/gpu_setup.sh
cat /proc/sys/vm/dirty_ratio /proc/sys/vm/dirty_background_ratio /proc/sys/vm/dirty_bytes
PROBE_TMP=$W python3 $REPO/.whl/probe2.py 2>&1 | tail -12
