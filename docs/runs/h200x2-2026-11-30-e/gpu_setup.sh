# Source on the GPU machine from the checkout root: installs the carried wheels into a temp dir, runs from elsewhere.
S=$(mktemp -d); python3 -m pip install -q --no-index --no-deps --target $S .whl/*.whl || exit 1
export PYTHONPATH=$S PATH=$S/bin:$PATH NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
REPO=$PWD; W=$(mktemp -d); cd $W
python3 -c "import sprite, torch, lightning; print('sprite', sprite.__file__, 'torch', torch.__version__, 'lightning', lightning.__version__)"
nvidia-smi -L
