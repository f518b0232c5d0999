pip install -q --no-index --no-deps --target /tmp/s build/whl/*.whl 2>&1 | grep -v WARNING
export PYTHONPATH=/tmp/s HF_HUB_OFFLINE=1
{
echo "PATH=$PATH"; echo "CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-unset}"; echo "NVIDIA_VISIBLE_DEVICES=${NVIDIA_VISIBLE_DEVICES-unset}"
which -a nvidia-smi; ls -l /usr/bin/nvidia-smi /usr/local/bin/nvidia-smi 2>&1
nvidia-smi -L; echo "rc=$?"
which python; python -c "from importlib import metadata; print('meta', metadata.version('torch'))"
python -c "import torch; print('torch', torch.__version__, torch.cuda.device_count())"
python -c "from sprite.launch import devicecount as d; print(d.of('auto'), d.of('cuda'), d.torch_build())"
env | grep -i -E "slurm|pbs|cuda|nvidia" | sort
} > $OUT/diag.txt 2>&1
cat $OUT/diag.txt
