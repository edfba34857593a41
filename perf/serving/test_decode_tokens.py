"""Single-stream decode speed, dense and MoE: one request at a time, many forced tokens.

decode tok/s per request = 1000 / TPOT, TPOT = (E2EL - TTFT) / (output tokens - 1) with the
server's token count. Absolute figures (recorded everywhere, gated where the plugin gates
absolute metrics, i.e. on GPU hardware ids); the in-run invariant is 0 failed requests.

On 2 shared vCPUs a client is now and then starved for a whole run and reads every answer in
one piece (TPOT 0, no decode speed to compute: seen in a CI run, all 5 requests). Such a run
is measured again, up to ATTEMPTS times, and the test skips with that reason if none streamed.
"""
from __future__ import annotations

import pytest

from fixtures.cases import record
from perfgate.workloads import serving
from perfgate.workloads.serving.loadgen import random_requests, run_load
from perfgate.workloads.serving.serving_metrics import summarize_run
from perfgate.workloads.serving.starvation import skip_reason, unstarved_runs

ATTEMPTS = 3


@pytest.mark.parametrize("model_kind", ["dense", "moe"])
def test_single_stream_decode(perf, request, serving_profile, model_kind):
    t = request.getfixturevalue("vllm_dense" if model_kind == "dense" else "vllm_moe")
    perf.identify(**t.workload)
    p = t.profile
    reqs = random_requests(t.token_pool, p.decode_requests, p.decode_input_len, p.decode_output_len, seed=8000)

    def run(_i):
        result = run_load(t.load(reqs, max_concurrency=1))
        assert result.failed == 0, f"{result.failed} failed requests: {result.errors()}"
        assert all(r.output_tokens == p.decode_output_len for r in result.records), \
            f"ignore_eos not honoured: output tokens {[r.output_tokens for r in result.records]}"
        return result, summarize_run(result)

    kept, every = unstarved_runs(run, lambda rs: not rs[1].decode_tok_s_values, wanted=1, extra=ATTEMPTS - 1)
    if not kept:
        pytest.skip(skip_reason(len(every), "every answer arrived in one read"))
    result, s = kept[0]
    busy, timing = serving.busy_records([s])  # on a GPU: was the decode step the device's or the host's?
    perf.record("decode_tok_s", s.decode_tok_s_values, unit="tok/s", better="higher", **timing)
    perf.record("tpot_ms", s.tpot_ms_values, unit="ms", better="lower", **timing)
    perf.record("ttft_ms", s.ttft_ms_values, unit="ms", better="lower", **timing)
    if s.engine is not None:  # the prefill step as the engine core timed it, beside the client's TTFT
        perf.record("engine_prefill_ms", [s.engine.prefill_ms], unit="ms", better="lower", **timing)
    perf.record("itl_p50_ms", [s.itl_ms.median], unit="ms", better="lower", **timing)
    record(perf, busy)
    perf.attach("requests", [r.to_dict() for r in result.records])
    perf.attach("workload", {"model": str(t.server.spec.model), "input_len": p.decode_input_len,
                             "output_len": p.decode_output_len, "requests": p.decode_requests})
