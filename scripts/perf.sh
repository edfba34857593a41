#!/usr/bin/env bash
# The main job: set up, then run the perf suite on whatever hardware is present.
# CPU machines run `-m cpu`; GPU machines run the GPU tests (those needing more GPUs
# than present skip with a reason). Override the selection with PERFGATE_MARKERS.
# Results: results/perf.json, results/summary.md, and the table on the terminal.
# PERFGATE_AREAS names a subset of areas (below).
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
# PERFGATE_AREAS="training kernels": only those areas (perf/<area>), e.g. what fits the time you have
# (docs/lifecycle.md has each area's wall time on one GPU).
TARGETS=(perf/)
if [ -n "${PERFGATE_AREAS:-}" ]; then
  TARGETS=()
  for area in $PERFGATE_AREAS; do
    if [ ! -d "perf/$area" ]; then
      echo "perf.sh: no area '$area' (PERFGATE_AREAS); the areas are: $(ls perf | tr '\n' ' ')" >&2
      exit 2
    fi
    TARGETS+=("perf/$area")
  done
fi
mkdir -p results
exec .venv/bin/python -m pytest -m "$MARKERS" "${TARGETS[@]}" -p no:cacheprovider \
  --perf-save results/perf.json --perf-markdown results/summary.md "$@"
