# Sourced by the GPU serving scripts (gpu_serving_session.sh, gpu_serving_power.sh) on a lent GPU with no
# package index: install the carried vLLM wheels (dev/gpu/vllm_gpu_carry.sh) unless SITE has them,
# install perfgate, build the model dirs, and export what every server and test of the session needs.
# Needs SITE, LIST (a distribution list for vllm_gpu_carry.sh, or empty) and say(); returns 1 on failure.

# NVLink multicast stays off on these machines (KINDS.md), in every process we start.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
if [ ! -f "$SITE/vllm/__init__.py" ]; then
    dev/gpu/vllm_gpu_carry.sh install "$SITE" $LIST || return 1
fi
export PYTHONPATH="$SITE"
say "vllm in $SITE ($(ls -d "$SITE"/*.dist-info | wc -l) distributions)"
python3 -m pip install -q --no-deps --no-build-isolation -e . || return 1
[ -f /tmp/models/dense-1b/config.json ] || python3 dev/gpu/build_gpu_serving_models.py /tmp/models || return 1
# DENSE=dense-1b serves the 1.1 B layout the profile used before (host-bound; the identity differs,
# so its runs read not-comparable against the 7.24 B baselines)
export PERFGATE_SERVING_MODEL=/tmp/models/${DENSE:-dense-7b} PERFGATE_SERVING_MOE_MODEL=/tmp/models/moe
export PERFGATE_SERVING_ENGINE_ARGS="${PERFGATE_SERVING_ENGINE_ARGS:---load-format dummy}"
# flashinfer is not carried (its wheels serve other backends): without this, vLLM 0.24's V2
# model runner imports it for top-k/top-p sampling and the engine core dies at start.
export VLLM_USE_FLASHINFER_SAMPLER="${VLLM_USE_FLASHINFER_SAMPLER:-0}"
# Compiled kernels are shared by every server of the session (and by a later run on this
# machine): only start-up time changes, not what is measured.
export TORCHINDUCTOR_CACHE_DIR=/tmp/inductor-cache TRITON_CACHE_DIR=/tmp/triton-cache
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv,noheader
