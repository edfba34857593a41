"""Continuous batching: throughput and latency at concurrency C (closed loop), against C=1.

Seed §10.2 (7B dummy, V100): from C=1 to C=32 output tok/s rose 19.8x while TPOT rose
only 9.8%; the cost of batching shows up in TTFT. The gated figures are in-run ratios:
output tok/s at C over C=1 (measured in alternating phases of the same test, so drift
hits both), and median TPOT at C over C=1.
"""
from __future__ import annotations

import statistics

import pytest

from perfgate.workloads.serving.loadgen import random_requests, run_load
from perfgate.metrics import paired_ratio
from perfgate.workloads.serving.prometheus_counters import StepCounters
from perfgate.workloads.serving.serving_metrics import summarize
from perfgate.workloads.serving.starvation import starved

LEVELS = (1, 2, 4, 8, 16, 32)


def _phase(target, concurrency: int, seed: int):
    p = target.profile
    n = max(p.min_requests, p.requests_per_slot * concurrency)
    reqs = random_requests(target.token_pool, n, p.input_len, p.output_len, seed=seed)
    result = run_load(target.load(reqs, max_concurrency=concurrency, seed=seed))
    assert result.failed == 0, f"C={concurrency}: {result.failed} failed requests: {result.errors()}"
    return result, summarize(result.records, result.duration_s)


@pytest.mark.parametrize("concurrency", LEVELS, ids=lambda c: f"C={c}")
def test_concurrency_sweep(perf, vllm_dense, record_latency, concurrency):
    p = vllm_dense.profile
    if concurrency not in p.concurrency:
        pytest.skip(f"C={concurrency} is not in the {p.name} profile's sweep {p.concurrency}")
    at_c, at_1, raw, per_step = [], [], [], []
    for rep in range(p.reps):
        if concurrency > 1:  # the C=1 reference, alternating with the measured level
            _, ref = _phase(vllm_dense, 1, seed=1000 + rep)
            at_1.append(ref)
        before = StepCounters.read(vllm_dense.base_url)
        result, s = _phase(vllm_dense, concurrency, seed=2000 + rep)
        per_step.append(StepCounters.read(vllm_dense.base_url).tokens_per_step_since(before))
        at_c.append(s)
        raw.append({"rep": rep, "summary": s.to_dict(), "records": [r.to_dict() for r in result.records]})

    perf.record("output_tok_s", [s.output_throughput_tok_s for s in at_c], unit="tok/s", better="higher")
    perf.record("request_rps", [s.request_throughput_rps for s in at_c], unit="req/s", better="higher")
    perf.record("total_tok_s", [s.total_token_throughput_tok_s for s in at_c], unit="tok/s", better="higher")
    record_latency(perf, at_c)
    if at_1:
        # The server's own batch: generated tokens per engine step over the phase at C (1.0 at
        # C=1 by construction, so recorded only above it); a server that stops batching reads 1.0.
        # Machine drift does not move it, but a slow client does: a slot stays empty until the
        # client has read the end of a stream and sent the next request. On 2 cores C=4 read
        # 2.9-3.9 in CI order, 1.59 when the cross-check had run first (cause not found yet).
        perf.record("generated_tokens_per_step", per_step, unit="x", better="higher")
        perf.record("output_tok_s_vs_c1", paired_ratio([s.output_throughput_tok_s for s in at_c],
                                                       [s.output_throughput_tok_s for s in at_1]),
                    unit="x", better="higher")
        # Repetitions with a starved client (TPOT ~0: a whole answer in one read) carry no TPOT
        # information and are left out of the ratio.
        pairs = [(c, r) for c, r in zip(at_c, at_1) if not starved(c.tpot_ms.median, r.tpot_ms.median)]
        tpot = paired_ratio([c.tpot_ms.median for c, _ in pairs], [r.tpot_ms.median for _, r in pairs])
        if tpot:
            perf.record("tpot_vs_c1", tpot, unit="x", better="lower")
    perf.attach("requests", raw)
    perf.attach("workload", {"input_len": p.input_len, "output_len": p.output_len, "concurrency": concurrency,
                             "reps": p.reps, "median_ttft_ms": statistics.median(v for s in at_c
                                                                                   for v in s.ttft_ms_values)})
