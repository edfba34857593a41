"""Cross-check our load generator against vLLM's own `vllm bench serve`.

Both tools load the same server with the same workload shape (random prompts of input_len
tokens, output_len forced tokens, greedy, the same request count and concurrency) *at the
same time*: we start `vllm bench serve`, wait until its timed run begins (after it imports
vLLM and sends its test prompt), and run ours alongside. Back-to-back runs on a shared
2-core machine drift by more than the tools differ; side by side, both instruments see the
same server state.

Per round we compare medians; the median over rounds of ours/bench must lie within the
profile's ``bench_bounds`` (perfgate.workloads.serving.BenchBounds): on GPU ITL and E2EL 5 % each.
The GPU's TTFT and TPOT were bounded too (10 %, 5 %) while the served model was the host-bound 1.1 B
one; on the 7.24 B model the same C=16 read TTFT ours/bench 0.795 and TPOT 1.067 with E2EL 0.990 and
ITL 1.001 (2026-12-02, results-store/1xH200/serving-7b-2026-12-02-lease2-run3-rest): the split below.
The 2-core CPU profile records the gaps without bounds: until 2026-12-02 it asserted ITL 5 %, E2EL
10 %, TPOT 25 %, TTFT 50 %, which held on AMD VMs and failed twice in two runs on an Intel AMX VM
where half the rounds had a client starved (ServingProfile.bench_bounds). TTFT is not an instrument figure
at C > 1: each closed-loop client settles into a phase pattern of its own, and the pattern
sets TTFT. On an aligned timeline at C=4, `vllm bench serve` sent one request of every wave
~7 ms ahead of the other three (prefilled alone, TTFT ~22 ms; the three waited a step, ~34
ms) while ours went in lock-step, so median TTFT ours/bench read 0.64-1.38 per round with
E2EL within 3 %. E2EL carries that TTFT: on 2 vCPUs TTFT is ~10 % of E2EL at C=4, so the
TTFT pattern alone moves E2EL by several percent (the CI run of 481f343: TTFT ours/bench 0.632,
E2EL 0.942, TPOT 1.007, ITL 1.002), and TPOT = (E2EL - TTFT)/(n - 1) takes up what TTFT gives
(a later run: TTFT 0.643, TPOT 1.159, E2EL 0.989, ITL 1.004), hence 10 % and 25 % there. At C=1 there is no pattern, but on 2 vCPUs most C=1 rounds had a client
starved of CPU (one CI run: 6 of 8 rounds), so C=1 cannot be the CI check here.

A round in which either client was starved (every token of most requests in one read:
median TPOT ~0, TTFT = E2EL) says nothing about the instruments and is run again, up to a
limit; if every round is starved the test is skipped and says so. Rounds whose tokens came
in pairs (median ITL ~0, TPOT fine) still compare TTFT, TPOT and E2EL, but not ITL.
"""
from __future__ import annotations

import statistics

import pytest

from perfgate.importers import vllm_bench as bench_import
from perfgate.judge.metrics import paired_ratio
from perfgate.workloads.serving.loadgen import random_requests, run_load
from perfgate.workloads.serving.serving_metrics import summarize_run
from perfgate.workloads.serving.starvation import skip_reason, starved, unstarved_runs
from perfgate.workloads.serving.vllm_bench import BenchServeRun, BenchServeSpec

EXTRA_ROUNDS = 3    # re-runs allowed for starved rounds


def test_vllm_bench_serve_crosscheck(perf, vllm_dense, tmp_path):
    """The gaps to `vllm bench serve` are recorded; where the profile has bench_bounds (the GPU), the
    agreement is asserted on the median over rounds. On 2 vCPUs it is not (ServingProfile.bench_bounds):
    there the test fails on failed requests, a wrong token count or an import that changes a number."""
    t = vllm_dense
    perf.identify(**t.workload)
    p = t.profile

    def run_round(rnd: int) -> dict:
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
        s = summarize_run(result)
        return {"round": rnd, "valid": not starved(s.tpot_ms.median, bench["median_tpot_ms"]), "s": s,
                "bench": bench, "records": result.records}

    kept, every = unstarved_runs(run_round, lambda r: not r["valid"], wanted=p.bench_rounds, extra=EXTRA_ROUNDS)
    raw = [{"round": r["round"], "valid": r["valid"], "ours": r["s"].to_dict(),
            "ours_records": [rec.to_dict() for rec in r["records"]],
            "bench": {k: v for k, v in r["bench"].items() if not isinstance(v, list)},
            "bench_ttfts_ms": [x * 1e3 for x in r["bench"].get("ttfts", [])]} for r in every]
    starved_rounds = len(every) - len(kept)
    if not kept:
        pytest.skip(skip_reason(len(every), "median TPOT ~0"))
    ours_ttft = [r["s"].ttft_ms.median for r in kept]
    ours_tpot = [r["s"].tpot_ms.median for r in kept]
    bench_ttft = [r["bench"]["median_ttft_ms"] for r in kept]
    bench_tpot = [r["bench"]["median_tpot_ms"] for r in kept]
    e2el_ratio = paired_ratio([r["s"].e2el_ms.median for r in kept], [r["bench"]["median_e2el_ms"] for r in kept])
    # Rounds whose tokens came in pairs (median ITL ~0, TPOT fine) compare everything but ITL.
    itl = [r for r in kept if not starved(r["s"].itl_ms.median, r["bench"]["median_itl_ms"])]
    itl_ratio = paired_ratio([r["s"].itl_ms.median for r in itl], [r["bench"]["median_itl_ms"] for r in itl])
    ttft_ratio = paired_ratio(ours_ttft, bench_ttft)
    tpot_ratio = paired_ratio(ours_tpot, bench_tpot)
    perf.record("ttft_median_ours_ms", ours_ttft, unit="ms", better="lower")
    perf.record("ttft_median_bench_ms", bench_ttft, unit="ms", better="lower")
    perf.record("tpot_median_ours_ms", ours_tpot, unit="ms", better="lower")
    perf.record("tpot_median_bench_ms", bench_tpot, unit="ms", better="lower")
    # The gap |ours/bench - 1| per round: 0 is perfect agreement; growth is a regression of either tool.
    perf.record("ttft_median_gap_vs_bench", [abs(r - 1) for r in ttft_ratio], unit="fraction", better="lower")
    perf.record("tpot_median_gap_vs_bench", [abs(r - 1) for r in tpot_ratio], unit="fraction", better="lower")
    perf.record("e2el_median_gap_vs_bench", [abs(r - 1) for r in e2el_ratio], unit="fraction", better="lower")
    if itl_ratio:  # else every round had tokens in pairs (median ITL ~0): ITL says nothing this run
        perf.record("itl_median_gap_vs_bench", [abs(r - 1) for r in itl_ratio], unit="fraction", better="lower")
    perf.attach("rounds", raw)
    ratios = {"ttft_median": ttft_ratio, "tpot_median": tpot_ratio, "e2el_median": e2el_ratio,
              "itl_median": itl_ratio}
    perf.attach("ratios_ours_over_bench", ratios)
    perf.attach("starved_rounds", starved_rounds)
    _check_import(tmp_path / f"round{every[0]['round']}" / "bench.json", every[0]["bench"], p)
    med = {k: statistics.median(v) for k, v in ratios.items() if v}
    summary = (f"median TTFT ours {statistics.median(ours_ttft):.2f} ms vs bench {statistics.median(bench_ttft):.2f} ms; "
               f"median TPOT ours {statistics.median(ours_tpot):.3f} ms vs bench {statistics.median(bench_tpot):.3f} ms; "
               "ours/bench per metric (median over rounds): " + ", ".join(f"{k} {v:.3f}" for k, v in med.items()))
    print(summary)
    bounds = p.bench_bounds
    if bounds is None:
        return
    for key, bound in (("e2el_median", bounds.e2el), ("itl_median", bounds.itl), ("tpot_median", bounds.tpot),
                       ("ttft_median", bounds.ttft)):
        if bound is not None and key in med:  # itl_median is absent when every round had tokens in pairs
            assert abs(med[key] - 1) <= bound, f"{key.split('_')[0].upper()} disagrees by more than {bound:.0%}: {summary}"


def _check_import(path, bench: dict, profile) -> None:
    """`perfgate import vllm-bench` on the file the real tool just wrote: this test's C, its numbers unchanged."""
    got = bench_import.read([path], "cpu-crosscheck" if profile.name == "cpu" else None)
    assert {n.test_id for n in got.numbers} == {f"{bench_import.SWEEP}[{profile.name}-C={profile.bench_concurrency}]"}
    samples = {n.metric: n.samples for n in got.numbers}
    assert samples["output_tok_s"] == (bench["output_throughput"],)
    assert samples["tpot_ms"] == (bench["median_tpot_ms"],)
    assert samples["ttft_ms"] == tuple(x * 1e3 for x in bench["ttfts"])  # --save-detailed: one per request
