"""Open-loop Poisson arrivals: completed throughput vs SLO goodput, and the highest rate that
still meets the SLO (seed §12.2: goodput peaks near 5 QPS while completed req/s keeps rising).

Offered rates are fractions of the capacity measured in this run (closed loop at the
profile's largest concurrency; the median of the profile's ``capacity_reps`` runs, so one
noisy run does not move every offered rate with it), so the sweep means the same thing on
any hardware. The GPU
profile uses the seed's SLO (TTFT <= 250 ms, TPOT <= 40 ms); the CPU profile's SLO is
relative to this run's unloaded latency (TTFT <= 4x, TPOT <= 2.5x the C=1 medians, about
the seed's SLO over its unloaded latency), with
floors of 10 ms / 1 ms so scheduler jitter on a shared 2-core machine cannot make it absurd.
"""
from __future__ import annotations

import statistics

from perfgate.workloads.serving.loadgen import random_requests, run_load
from perfgate.workloads.serving.serving_metrics import Slo, highest_rate_meeting_slo, summarize_run


def _closed(target, n, concurrency, seed):
    p = target.profile
    reqs = random_requests(target.token_pool, n, p.input_len, p.output_len, seed=seed)
    result = run_load(target.load(reqs, max_concurrency=concurrency, seed=seed))
    assert result.failed == 0, f"C={concurrency}: {result.failed} failed requests: {result.errors()}"
    return summarize_run(result)


def test_poisson_rate_sweep(perf, vllm_dense, record_latency):
    """Gates nothing on the CPU machine: SLO attainment and the rate sweep move by whole requests and
    whole rate steps with scheduler stalls there (record-only in baselines/cpu-*/tolerances.toml)."""
    t = vllm_dense
    perf.identify(**t.workload)
    p = t.profile
    unloaded = _closed(t, 2 * p.min_requests, 1, seed=3000)
    capacities = [_closed(t, p.capacity_requests or p.rate_requests, max(p.concurrency), seed=3001 + rep)
                  for rep in range(p.capacity_reps)]
    capacity_rps = statistics.median(c.request_throughput_rps for c in capacities)
    # a request whose tokens all arrived in one read (starved client) has TPOT 0: not a reference
    unloaded_tpot = statistics.median([v for v in unloaded.tpot_ms_values if v > 0] or [0.0])
    slo = p.slo or Slo(ttft_ms=max(10.0, p.slo_ttft_x * unloaded.ttft_ms.median),
                       tpot_ms=max(1.0, p.slo_tpot_x * unloaded_tpot))
    by_frac = {f: [] for f in p.rate_fractions}
    best_rps, best_frac, raw = [], [], []
    for rep in range(p.rate_reps):
        attainment = {}
        for frac in p.rate_fractions:
            seed = 4000 + 100 * rep + int(frac * 100)
            reqs = random_requests(t.token_pool, p.rate_requests, p.input_len, p.output_len, seed=seed)
            result = run_load(t.load(reqs, rate_rps=frac * capacity_rps, burstiness=1.0,
                                     max_concurrency=p.rate_max_concurrency, seed=seed))
            assert result.failed == 0, f"{frac}x capacity: {result.failed} failed requests: {result.errors()}"
            s = summarize_run(result, slo=slo)
            by_frac[frac].append(s)
            attainment[frac] = s.slo_attainment
            raw.append({"rep": rep, "fraction": frac, "offered_rps": frac * capacity_rps, "summary": s.to_dict(),
                        "records": [r.to_dict() for r in result.records]})
        top = highest_rate_meeting_slo(attainment, p.min_attainment)
        best_frac.append(top)
        best_rps.append(top * capacity_rps)

    perf.record("capacity_rps", [c.request_throughput_rps for c in capacities], unit="req/s", better="higher")
    for frac, sums in by_frac.items():
        tag = f"@{frac:g}x"
        perf.record(f"completed_rps{tag}", [s.request_throughput_rps for s in sums], unit="req/s", better="higher")
        perf.record(f"goodput_rps{tag}", [s.goodput_rps for s in sums], unit="req/s", better="higher")
        # Attainment is a fraction of this run's own requests; past capacity its tolerance is wider
        # (pyproject.toml), and on the shared CPU VMs it is record-only (baselines/cpu-*/tolerances.toml).
        perf.record(f"slo_attainment{tag}", [s.slo_attainment for s in sums], unit="fraction", better="higher")
        record_latency(perf, sums, prefix=f"{frac:g}x_")
    perf.record("max_rate_meeting_slo_rps", best_rps, unit="req/s", better="higher")
    # Moves in whole steps of the rate fractions: its tolerance (pyproject.toml) allows for that.
    perf.record("max_rate_meeting_slo_vs_capacity", best_frac, unit="x", better="higher")
    perf.attach("slo", {"ttft_ms": slo.ttft_ms, "tpot_ms": slo.tpot_ms, "min_attainment": p.min_attainment,
                        "relative": p.slo is None, "unloaded": unloaded.to_dict(),
                        "capacity": [c.to_dict() for c in capacities], "capacity_rps": capacity_rps,
                        "capacity_concurrency": max(p.concurrency),
                        "median_best_fraction": statistics.median(best_frac)})
    perf.attach("requests", raw)
