"""Cross-check our load generator against vLLM's own `vllm bench serve`.

Both tools load the same server with the same workload shape (random prompts of input_len
tokens, output_len forced tokens, greedy, the same request count and concurrency) *at the
same time*: we start `vllm bench serve`, wait until its timed run begins (after it imports
vLLM and sends its test prompt), and run ours alongside. Back-to-back runs on a shared
2-core machine differ by 2x from one minute to the next; side by side, both instruments see
the same server state, so what differs is the instruments.

Per round we compare medians. Whole-request latency (E2EL) and inter-chunk latency (ITL)
must agree within 5 % (the issue's target). TTFT and TPOT are recorded and gated as gaps,
and must agree within 50 % and 15 %: measured here side by side, our median TTFT reads
0.48-0.99 of bench's (median over rounds 0.70-0.72) while E2EL and ITL agree within ~5 %, and TPOT = (E2EL - TTFT)/(n - 1)
moves the other way by the same milliseconds (ours 0.93-1.20 of bench's). The two clients
time the first chunk differently on 2 busy cores (cause not pinned down: not text vs
token-id prompts, not SSE parsing); a larger gap is a bug in one of the tools.
"""
from __future__ import annotations

import statistics

from perfgate.workloads.serving.loadgen import random_requests, run_load
from perfgate.workloads.serving.serving_metrics import summarize
from perfgate.workloads.serving.vllm_bench import BenchServeRun, BenchServeSpec

TARGET = 0.05       # E2EL and ITL medians
TTFT_BOUND = 0.50
TPOT_BOUND = 0.15


def test_vllm_bench_serve_crosscheck(perf, vllm_dense, tmp_path):
    t = vllm_dense
    p = t.profile
    ours_ttft, ours_tpot, bench_ttft, bench_tpot, raw = [], [], [], [], []
    e2el_ratio, itl_ratio = [], []
    for rnd in range(p.bench_rounds):
        spec = BenchServeSpec(base_url=t.base_url, model=t.model, tokenizer=str(t.server.spec.model),
                              work_dir=tmp_path / f"round{rnd}", input_len=p.input_len, output_len=p.output_len,
                              num_prompts=p.bench_requests, max_concurrency=p.bench_concurrency, seed=rnd)
        reqs = random_requests(t.token_pool, p.bench_requests, p.input_len, p.output_len, seed=9000 + rnd)
        bench_run = BenchServeRun(spec).start()
        try:
            bench_run.wait_main_run()
            result = run_load(t.load(reqs, max_concurrency=p.bench_concurrency, seed=rnd))
            bench = bench_run.result()
        finally:
            bench_run.stop()
        assert result.failed == 0, f"ours: {result.failed} failed requests: {result.errors()}"
        assert bench["failed"] == 0, f"vllm bench serve: {bench['failed']} failed requests"
        assert bench["total_output_tokens"] == p.bench_requests * p.output_len, \
            f"vllm bench serve generated {bench['total_output_tokens']} tokens, expected {p.bench_requests * p.output_len}"
        s = summarize(result.records, result.duration_s)
        ours_ttft.append(s.ttft_ms.median)
        ours_tpot.append(s.tpot_ms.median)
        bench_ttft.append(bench["median_ttft_ms"])
        bench_tpot.append(bench["median_tpot_ms"])
        e2el_ratio.append(s.e2el_ms.median / bench["median_e2el_ms"])
        if s.itl_ms.median > 0.1 and bench["median_itl_ms"] > 0.1:  # ~0: tokens came in bursts (starved clients)
            itl_ratio.append(s.itl_ms.median / bench["median_itl_ms"])
        raw.append({"round": rnd, "ours": s.to_dict(), "ours_records": [r.to_dict() for r in result.records],
                    "bench": {k: v for k, v in bench.items() if not isinstance(v, list)},
                    "bench_ttfts_ms": [x * 1e3 for x in bench.get("ttfts", [])]})

    ttft_ratio = [o / b for o, b in zip(ours_ttft, bench_ttft)]
    tpot_ratio = [o / b for o, b in zip(ours_tpot, bench_tpot)]
    perf.record("ttft_median_ours_ms", ours_ttft, unit="ms", better="lower")
    perf.record("ttft_median_bench_ms", bench_ttft, unit="ms", better="lower")
    perf.record("tpot_median_ours_ms", ours_tpot, unit="ms", better="lower")
    perf.record("tpot_median_bench_ms", bench_tpot, unit="ms", better="lower")
    # The gap |ours/bench - 1| per round: 0 is perfect agreement; growth is a regression of either tool.
    perf.record("ttft_median_gap_vs_bench", [abs(r - 1) for r in ttft_ratio], unit="fraction", better="lower")
    perf.record("tpot_median_gap_vs_bench", [abs(r - 1) for r in tpot_ratio], unit="fraction", better="lower")
    perf.record("e2el_median_gap_vs_bench", [abs(r - 1) for r in e2el_ratio], unit="fraction", better="lower")
    assert itl_ratio, "every round's tokens arrived in bursts (median ITL ~0): clients starved of CPU"
    perf.record("itl_median_gap_vs_bench", [abs(r - 1) for r in itl_ratio], unit="fraction", better="lower")
    perf.attach("rounds", raw)
    ratios = {"ttft_median": ttft_ratio, "tpot_median": tpot_ratio, "e2el_median": e2el_ratio,
              "itl_median": itl_ratio}
    perf.attach("ratios_ours_over_bench", ratios)
    med = {k: statistics.median(v) for k, v in ratios.items()}
    summary = (f"median TTFT ours {statistics.median(ours_ttft):.2f} ms vs bench {statistics.median(bench_ttft):.2f} ms; "
               f"median TPOT ours {statistics.median(ours_tpot):.3f} ms vs bench {statistics.median(bench_tpot):.3f} ms; "
               "ours/bench per metric (median over rounds): " + ", ".join(f"{k} {v:.3f}" for k, v in med.items()))
    assert abs(med["e2el_median"] - 1) <= TARGET, f"E2EL disagrees by more than {TARGET:.0%}: {summary}"
    assert abs(med["itl_median"] - 1) <= TARGET, f"ITL disagrees by more than {TARGET:.0%}: {summary}"
    assert abs(med["tpot_median"] - 1) <= TPOT_BOUND, f"TPOT disagrees by more than {TPOT_BOUND:.0%}: {summary}"
    assert abs(med["ttft_median"] - 1) <= TTFT_BOUND, f"TTFT disagrees by more than {TTFT_BOUND:.0%}: {summary}"
