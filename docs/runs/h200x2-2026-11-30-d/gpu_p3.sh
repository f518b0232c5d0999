. .whl/gpu_setup.sh
mount | grep " / " ; PROBE_TMP=$W python3 $REPO/.whl/probe3.py 2>&1 | tail -14
