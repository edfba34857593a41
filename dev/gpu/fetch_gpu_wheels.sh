#!/usr/bin/env bash
# Download the wheels the GPU machine lacks into .whl/ (Python 3.12, manylinux x86-64).
#
# Why: the GPU machines have no package index. Megatron-Core is one pure-Python wheel
# (plus a small datasets helper .so we do not use) that needs only torch, numpy and
# packaging, all of which the GPU image has; so megatron-core alone travels.
# It is carried with `run(carry=[".whl"])` and installed there with:
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
#       --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
#
# Usage: dev/gpu/fetch_gpu_wheels.sh [pip]     (default pip: python3 -m pip)
set -euo pipefail

MEGATRON_CORE_VERSION="${MEGATRON_CORE_VERSION:-0.19.2}"
PIP="${1:-python3 -m pip}"
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
DEST="$ROOT/.whl"

# .whl/ must never be committed: keep it out of git (local exclude, not .gitignore).
EXCLUDE="$ROOT/.git/info/exclude"
if [ -d "$ROOT/.git" ] && ! grep -qx '/.whl/' "$EXCLUDE" 2>/dev/null; then
    mkdir -p "$(dirname "$EXCLUDE")"
    echo '/.whl/' >> "$EXCLUDE"
fi

mkdir -p "$DEST"
# One version of each package: two versions of one name stop the whole install there.
find "$DEST" -maxdepth 1 -name 'megatron_core-*.whl' ! -name "megatron_core-${MEGATRON_CORE_VERSION}-*" -delete

$PIP download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
    -d "$DEST" "megatron-core==${MEGATRON_CORE_VERSION}"

# Show what the wheel needs beyond extras, so a new version's new dependency is seen here.
for whl in "$DEST"/megatron_core-*.whl; do
    echo "$(basename "$whl") requires:"
    unzip -p "$whl" '*/METADATA' | grep '^Requires-Dist' | grep -v 'extra ==' | sed 's/^/  /'
done
du -sh "$DEST"
