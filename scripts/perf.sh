#!/usr/bin/env bash
# The main job: set up, then run the perf suite on whatever hardware is present.
# CPU machines run `-m cpu`; GPU machines run the GPU tests (those needing more GPUs
# than present skip with a reason). Override the selection with PERFGATE_MARKERS.
# Results: results/perf.json, results/summary.md, and the table on the terminal.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [ -n "${PERFGATE_MARKERS:-}" ]; then
  MARKERS=$PERFGATE_MARKERS
elif command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  MARKERS="not cpu"
else
  MARKERS="cpu"
fi
mkdir -p results
exec .venv/bin/python -m pytest -m "$MARKERS" perf/ -p no:cacheprovider \
  --perf-save results/perf.json --perf-markdown results/summary.md "$@"
