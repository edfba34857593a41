#!/usr/bin/env bash
# Set up, then run everything that must pass: perfgate's own tests, the correctness
# properties, and the CPU perf suite (gated on in-run ratios and correctness).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
export HYPOTHESIS_PROFILE=${HYPOTHESIS_PROFILE:-ci}
# --durations: where CI's ~25 minutes go, in every log (the budget is tight)
.venv/bin/python -m pytest tests correctness -p no:cacheprovider -q --durations=15 "$@"
# the CPU perf suite without its `slow` cases: on 2 vCPUs they take minutes and gate nothing (every figure
# recorded only on the CPU ids); scripts/perf.sh, the main job, runs them
.venv/bin/python -m pytest -m "cpu and not slow" perf/ -p no:cacheprovider --perf-save results/ci-perf.json \
  --perf-markdown results/ci-summary.md --durations=15 "$@"
