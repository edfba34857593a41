#!/usr/bin/env bash
# One device call's worth of the 1-GPU training suite on a lent GPU machine: install perfgate,
# run `pytest -m 1gpu perf/training` (extra pytest arguments after RUN) inside LIMIT_S seconds,
# and leave under $OUT: RUN.json (--perf-save) and RUN-pytest.log. pytest gets SIGINT before
# the limit, so the finished tests' results are still saved; the script exits with pytest's
# status (124 when the limit cut it short), never 0 after a failure.
#
# Usage (device call): dev/gpu/gpu_training_session.sh RUN [PYTEST_ARGS...]
#   env: LIMIT_S (default 560), MUTATION (a PERFGATE_TEST_MUTATION for this run only),
#        PERFGATE_GIT_COMMIT (the commit to record where the machine's .git is not the tree's: a device
#        copy can carry the .git of an earlier commit under a newer tree)
set -uo pipefail
RUN="${1:?usage: gpu_training_session.sh RUN [PYTEST_ARGS...]}"
shift
OUT="${OUT:-/tmp/out}"
LIMIT_S="${LIMIT_S:-560}"
mkdir -p "$OUT"
# NVLink multicast stays off on these machines, in every process we start.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
python3 -c "import importlib.metadata as m; m.version(\"perfgate\")" 2>/dev/null || python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null || exit 1
env ${MUTATION:+PERFGATE_TEST_MUTATION=$MUTATION} timeout -s INT -k 30 "$LIMIT_S" \
    python3 -m pytest -m 1gpu perf/training -p no:cacheprovider --perf-save "$OUT/$RUN.json" "$@" \
    > "$OUT/$RUN-pytest.log" 2>&1
rc=$?
tail -45 "$OUT/$RUN-pytest.log"
echo "[gpu-training] $RUN: pytest rc=$rc"
exit $rc
