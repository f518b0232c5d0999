# the CUDA-only tests of the stager and of sharded saves, plus the state dicts' tests, from outside the checkout
set -u
pip install -q --no-index --no-deps --target /tmp/s build/whl/*.whl 2>&1 | grep -v WARNING
export PYTHONPATH=/tmp/s HF_HUB_OFFLINE=1 PATH=/tmp/s/bin:$PATH SPRITE_TEST_WARM=0
rm -rf /tmp/t && mkdir -p /tmp/t && cp -r tests docs /tmp/t/ && cd /tmp/t
{
python -c "import torch, lightning, pytest; print(torch.__version__, lightning.__version__, pytest.__version__)"
timeout 400 python -m pytest -q -p no:cacheprovider tests/test_host_copy.py tests/test_state_dicts.py \
  tests/test_runtime_shard.py tests/test_dcp_write.py tests/test_integrity.py -k "not torchs_reader_and_sprites_load_what_sprites_writer_wrote" 2>&1 | tail -15
} > $OUT/pytest_cuda.txt 2>&1
cat $OUT/pytest_cuda.txt
