"""serving_metrics.summarize on synthetic records: every definition checked by hand numbers."""
from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perfgate.workloads.serving.loadgen import RequestRecord, arrival_offsets_s
from perfgate.workloads.serving.serving_metrics import Slo, highest_rate_meeting_slo, summarize


def rec(i, send, chunks, out_tokens, prompt_tokens=10, error=None):
    return RequestRecord(index=i, tag="t", due_s=send, send_s=send, first_chunk_s=chunks[0] if chunks else None,
                         chunk_s=list(chunks), end_s=(chunks[-1] + 0.001) if chunks else None,
                         prompt_tokens=prompt_tokens, output_tokens=out_tokens, error=error)


def test_ttft_tpot_itl_e2el_by_hand():
    # send at 0; first chunk at 0.1 s; 4 more chunks every 0.02 s; 5 tokens
    r = rec(0, 0.0, [0.1, 0.12, 0.14, 0.16, 0.18], 5)
    s = summarize([r], duration_s=0.2)
    assert s.ttft_ms.median == pytest.approx(100.0)
    assert s.e2el_ms.median == pytest.approx(180.0)        # last content chunk, not end of stream
    assert s.tpot_ms.median == pytest.approx(80.0 / 4)     # (E2EL - TTFT) / (n - 1)
    assert s.itl_ms.median == pytest.approx(20.0)
    assert s.itl_ms.n == 4
    assert s.decode_tok_s_values == [pytest.approx(50.0)]


def test_tokens_come_from_usage_not_chunks():
    # 3 chunks carrying 9 tokens (several tokens per chunk under load): TPOT uses 9
    r = rec(0, 0.0, [0.05, 0.25, 0.45], 9)
    s = summarize([r], duration_s=1.0)
    assert s.tpot_ms.median == pytest.approx((450.0 - 50.0) / 8)
    assert s.itl_ms.median == pytest.approx(200.0)   # ITL stays per chunk
    assert s.output_tokens == 9


def test_throughputs_divide_by_duration_and_skip_failures():
    ok = [rec(i, 0.0, [0.1, 0.2], 2, prompt_tokens=100) for i in range(3)]
    bad = rec(3, 0.0, [], None, prompt_tokens=None, error="HTTP 500")
    s = summarize(ok + [bad], duration_s=2.0)
    assert (s.completed, s.failed) == (3, 1)
    assert s.request_throughput_rps == pytest.approx(1.5)
    assert s.output_throughput_tok_s == pytest.approx(3.0)
    assert s.total_token_throughput_tok_s == pytest.approx((300 + 6) / 2.0)
    assert s.ttft_ms.n == 3


def test_goodput_counts_requests_meeting_every_bound():
    fast = rec(0, 0.0, [0.05, 0.06, 0.07], 3)      # ttft 50, tpot 10
    slow_ttft = rec(1, 0.0, [0.3, 0.31, 0.32], 3)  # ttft 300
    slow_tpot = rec(2, 0.0, [0.05, 0.15, 0.25], 3)  # tpot 100
    failed = rec(3, 0.0, [], None, error="timeout")
    s = summarize([fast, slow_ttft, slow_tpot, failed], duration_s=2.0, slo=Slo(ttft_ms=250, tpot_ms=40))
    assert s.goodput_rps == pytest.approx(0.5)      # 1 good request / 2 s
    assert s.slo_attainment == pytest.approx(0.25)  # failed requests meet no SLO
    only_ttft = summarize([fast, slow_ttft, slow_tpot], duration_s=1.0, slo=Slo(ttft_ms=250))
    assert only_ttft.slo_attainment == pytest.approx(2 / 3)


def test_bound_is_inclusive_like_vllm_bench():
    r = rec(0, 0.0, [0.25, 0.29], 2)   # ttft exactly 250 ms, tpot 40 ms
    s = summarize([r], duration_s=1.0, slo=Slo(ttft_ms=250, tpot_ms=40.000001))
    assert s.slo_attainment == 1.0


def test_single_token_requests_have_no_tpot_but_count():
    s = summarize([rec(0, 0.0, [0.1], 1)], duration_s=1.0, slo=Slo(tpot_ms=1.0))
    assert s.tpot_ms.n == 0 and math.isnan(s.tpot_ms.median)
    assert s.slo_attainment == 1.0


def test_percentiles_match_numpy_linear_interpolation():
    recs = [rec(i, 0.0, [0.001 * (i + 1), 0.001 * (i + 1) + 0.01], 2) for i in range(100)]
    s = summarize(recs, duration_s=1.0)
    assert s.ttft_ms.percentiles["p99"] == pytest.approx(99.01)
    assert s.ttft_ms.percentiles["p50"] == pytest.approx(50.5)
    assert s.ttft_ms.mean == pytest.approx(50.5)


def test_dict_records_from_saved_json_give_the_same_summary():
    recs = [rec(i, 0.01 * i, [0.01 * i + 0.05, 0.01 * i + 0.07, 0.01 * i + 0.1], 3) for i in range(5)]
    a = summarize(recs, duration_s=0.5, slo=Slo(ttft_ms=60))
    b = summarize([r.to_dict() for r in recs], duration_s=0.5, slo=Slo(ttft_ms=60))
    da, db = a.to_dict(), b.to_dict()
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"):  # saved chunk times are rounded to 1 us
        assert da.pop(key) == pytest.approx(db.pop(key), abs=1e-3)
    assert da == db


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="duration_s"):
        summarize([], duration_s=0.0)
    with pytest.raises(ValueError, match="at least one bound"):
        Slo()
    with pytest.raises(ValueError, match="ttft_ms"):
        Slo(ttft_ms=-1)


def test_empty_run_is_nan_not_an_error():
    s = summarize([], duration_s=1.0, slo=Slo(ttft_ms=1))
    assert s.completed == 0 and math.isnan(s.ttft_ms.mean) and math.isnan(s.slo_attainment)


def test_highest_rate_meeting_slo_stops_at_first_miss():
    assert highest_rate_meeting_slo({1.0: 1.0, 2.0: 0.95, 4.0: 0.5, 8.0: 0.97}, 0.9) == 2.0
    assert highest_rate_meeting_slo({1.0: 0.5, 2.0: 1.0}, 0.9) == 0.0
    assert highest_rate_meeting_slo({}, 0.9) == 0.0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0.001, 1.0), st.floats(0.001, 0.1), st.integers(2, 64)), min_size=1, max_size=30))
def test_invariants(rows):
    recs = [rec(i, 0.0, [ttft + k * gap for k in range(n)], n) for i, (ttft, gap, n) in enumerate(rows)]
    s = summarize(recs, duration_s=10.0, slo=Slo(ttft_ms=500, tpot_ms=50))
    assert 0.0 <= s.slo_attainment <= 1.0
    assert s.goodput_rps <= s.request_throughput_rps + 1e-12
    assert s.ttft_ms.percentiles["p50"] <= s.ttft_ms.percentiles["p99"] + 1e-9
    for r, tpot in zip(rows, s.tpot_ms_values):  # evenly spaced chunks, one token each: TPOT == gap
        assert tpot == pytest.approx(r[1] * 1e3, rel=1e-6)


def test_poisson_arrivals_have_the_asked_mean_rate_and_gamma_burstiness():
    import numpy as np
    for burstiness in (0.5, 1.0, 4.0):
        t = np.asarray(arrival_offsets_s(20001, rate_rps=50.0, burstiness=burstiness, seed=1))
        gaps = np.diff(t)
        assert t[0] == 0.0 and np.all(gaps >= 0)
        assert gaps.mean() == pytest.approx(1 / 50.0, rel=0.05)
        cv = gaps.std() / gaps.mean()          # gamma: cv = 1/sqrt(shape)
        assert cv == pytest.approx(1 / math.sqrt(burstiness), rel=0.08)
    assert arrival_offsets_s(3, None, 1.0, 0) == [0.0, 0.0, 0.0]
