#!/usr/bin/env bash
# One device call's worth of the GPU serving suite on a lent H200 (no package index there):
# install the carried vLLM wheels (dev/gpu/vllm_gpu_carry.sh) unless this machine has them,
# install perfgate, build the model dirs, check the import, and run
#   pytest -m "1gpu and vllm" perf/serving --perf-save $OUT/<run>.json
# inside the call's time (pytest is interrupted with SIGINT before the call's limit, so the
# finished tests' results are still saved). What comes back under $OUT: <run>.json,
# <run>-pytest.log, <run>-imports.txt (with TRACE=1), <run>-logs.tgz (server and bench logs).
#
# Usage (device call, after the pieces are stashed):
#   dev/gpu/gpu_serving_session.sh RUN [SITE] [DIST_LIST]
#   env: TRACE=1 (log every import, for dev/gpu/vllm_import_trace.py), LIMIT_S (default 570:
#        seconds this script may take in all), PYTEST_K (a pytest -k expression), PYTEST_ARGS
#        (extra pytest arguments, split on spaces), DENSE (dense-7b, the profile's model, or
#        dense-1b, the 1.1 B model it replaced: the dense model dir), PERFGATE_GIT_COMMIT (the
#        commit to record where the machine's .git is not the tree's: a device copy can carry the
#        .git of an earlier commit under a newer tree)
# The whole selection does not fit one 600 s call (the dense tests take ~470 s with their
# server starts, the MoE case ~100-130 s more): run it as two calls on one warm machine,
#   PYTEST_K="not moe" dev/gpu/gpu_serving_session.sh run1
#   PYTEST_K="moe" dev/gpu/gpu_serving_session.sh run1-moe
# The script exits with pytest's status: 124 when the time limit cut pytest short.
set -uo pipefail
RUN="${1:?usage: gpu_serving_session.sh RUN [SITE] [DIST_LIST]}"
SITE="${2:-/tmp/site}"
LIST="${3:-}"
OUT="${OUT:-/tmp/out}"
LIMIT_S="${LIMIT_S:-570}"
T0=$(date +%s)
say() { echo "[gpu-serving $(( $(date +%s) - T0 )) s] $*"; }
mkdir -p "$OUT"

source dev/gpu/gpu_serving_env.sh || exit 1

TRACE_DIR=/tmp/vllm-trace-$RUN
mkdir -p "$TRACE_DIR"
if [ "${TRACE:-0}" = 1 ]; then export PYTHONPROFILEIMPORTTIME=1; fi
python3 -c "import vllm, vllm.entrypoints.openai.api_server as a; print('vllm', vllm.__version__, 'api_server ok')" \
    2> "$TRACE_DIR/probe-server.log"
rc=$?
grep -v '^import time:' "$TRACE_DIR/probe-server.log" | tail -20
say "import probe rc=$rc"

left=$(( LIMIT_S - ($(date +%s) - T0) - 45 ))
say "pytest for at most $left s"
PYTHONUNBUFFERED=1 timeout -s INT -k 30 "$left" python3 -m pytest -m "1gpu and vllm" perf/serving \
    -p no:cacheprovider --basetemp="/tmp/pytest-$RUN" --perf-save "$OUT/$RUN.json" \
    ${PYTEST_K:+-k "$PYTEST_K"} ${PYTEST_ARGS:-} 2>&1 \
    | grep -v '^import time:' > "$OUT/$RUN-pytest.log"
pytest_rc=${PIPESTATUS[0]}
say "pytest rc=$pytest_rc$([ "$pytest_rc" = 124 ] && echo ' (cut short by the time limit: split the selection with PYTEST_K)')"
tail -40 "$OUT/$RUN-pytest.log"
unset PYTHONPROFILEIMPORTTIME

if [ "${TRACE:-0}" = 1 ]; then
    python3 dev/gpu/vllm_import_trace.py "$SITE" "$TRACE_DIR" "/tmp/pytest-$RUN" > "$OUT/$RUN-imports.txt"
    head -3 "$OUT/$RUN-imports.txt"; grep -c '^used' "$OUT/$RUN-imports.txt"
    grep '^used' "$OUT/$RUN-imports.txt" | awk '{print $2}' > "/tmp/vllm-used-$RUN.txt"
fi
# server and bench logs without the import lines, at most 1 MB each
mkdir -p "/tmp/logs-$RUN"
find "/tmp/pytest-$RUN" -name '*.log' | while read -r f; do
    dst="/tmp/logs-$RUN/$(echo "${f#/tmp/pytest-$RUN/}" | tr '/' '_')"
    grep -v '^import time:' "$f" | tail -c 1000000 > "$dst"
done
tar -C /tmp -czf "$OUT/$RUN-logs.tgz" "logs-$RUN"
say "done"
exit "$pytest_rc"
