. .whl/gpu_setup.sh
df -hT $W /tmp | cat; nproc
PROBE_TMP=$W python3 $REPO/.whl/probe_io.py 2>&1 | grep -v Warn | grep -v "return func"
