# hashing threads beside a Python-bound loop (benchmarks/hash_beside.py), from outside the checkout
set -u
pip install -q --no-index --no-deps --target /tmp/s build/whl/*.whl 2>&1 | grep -v WARNING
export PYTHONPATH=/tmp/s HF_HUB_OFFLINE=1 PATH=/tmp/s/bin:$PATH
mkdir -p /tmp/h && cp benchmarks/hash_beside.py benchmarks/shared_send.py /tmp/h/ && cd /tmp/h
R=$OUT/hash_beside.txt
{
nproc; python -c "import torch; print(torch.__version__)"
for G in "$@"; do
  echo "--- $G"
  ( time timeout 240 python hash_beside.py $G ) 2>&1 | grep -vE "^(user|sys)"
done
} > $R 2>&1
cat $R
