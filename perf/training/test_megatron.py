"""Megatron-Core on GPU: pipeline bubble (1F1B, interleaved), TP/DP with SP, full recompute (issue 9).

Everything here needs CUDA and megatron-core (markers ``megatron`` + ``Ngpu``; the plugin
skips with the reason otherwise). Megatron's schedules allocate on ``device="cuda"``, so
there is no CPU variant; the CPU pipeline measurements are in test_pipeline.py.

Pipeline (seed report §8): the 163M GPT, TP=1, DP=1, microbatch 2, M in {1, 4, 16}; PP 2/4/8
by marker, interleaved with v=2 where M is a multiple of PP. Busy time per stage comes from
Megatron's own ``config.timers`` hooks ('forward-compute'/'backward-compute') timed with CUDA
events. Speedup is against PP=1 (``forward_backward_no_pipelining`` on one GPU) launched in
the same session.

TP/SP and recompute (seed §7): the 110M GPT, global batch 16, microbatch 2, every (TP, DP)
with TP x DP = the GPUs of the marker, SP on/off for TP >= 2, all in one launch; full
recompute on/off at sequence length 4096 with TP=2.
"""
from __future__ import annotations

import math

import pytest

from fixtures.cases import params
from perfgate.judge.metrics import paired_ratio, paired_saving
from perfgate.workloads import pipeline
from perfgate.workloads.pipeline import series
from perfgate.workloads.pipeline.megatron_common import TP_MODEL
from perfgate.workloads.pipeline.megatron_tp import MegatronTPSpec, TPCase

PROFILE = pipeline.MEGATRON_GPU
LONG_SEQ = 4096
# Seed report (8x V100 PCIe, Megatron-Core 0.9.0), kept beside our numbers for the report.
SEED = {
    "pp_speedup_pp8_m16": 2.59, "pp_theory_bubble_pp8_m16": 0.304, "pp_param_imbalance_pp8": 2.76,
    "sp_memory_saving_tp2_seq4096": 0.013, "recompute_memory_saving_tp2_seq4096": 0.781,
    "recompute_throughput_cost_tp2_seq4096": 0.297,
}
PP_M_CASES = params(pipeline.cases(PROFILE, "m"))
PP_TREND_CASES = params(pipeline.cases(PROFILE, "trend"))


def _gpu_marks(gpus: int, key: str) -> list:
    return [pytest.mark.megatron, getattr(pytest.mark, f"{gpus}gpu"), pytest.mark.xdist_group(key)]


# -- pipeline ------------------------------------------------------------------------------------

@pytest.mark.parametrize("schedule, pp, m", PP_M_CASES)
def test_megatron_pipeline_bubble(perf, runs, schedule, pp, m):
    run = pipeline.measure(runs, PROFILE, schedule, pp)
    s = run.series[m]
    expected_calls = 2 * m * run.spec.virtual_stages
    for rank, calls in enumerate(s.chunk_calls_by_rank):
        assert all(c == expected_calls for c in calls), (
            f"rank {rank}: Megatron's compute timers fired {calls} times per step, expected {expected_calls}")
    unpaired = run.by_rank(m, "unpaired_timer_stops")
    assert not any(unpaired), f"Megatron stopped timers it never started: {unpaired} per rank"
    assert s.loss and all(math.isfinite(v) for v in s.loss), f"non-finite loss at M={m}: {s.loss}"
    ref = pipeline.measure_pp1(runs)[m]
    perf.record("bubble", s.bubble, unit="fraction", better="lower")
    perf.record("bubble_vs_theory", s.bubble_vs_theory, unit="x", better="lower")
    perf.record("tokens_per_s", s.tokens_per_s, unit="tok/s", better="higher")
    perf.record("speedup_vs_pp1", pipeline.speedup_vs_pp1(s, ref), unit="x", better="higher")
    perf.record("stage_time_imbalance", s.busy_imbalance, unit="x", better="lower")
    perf.record("stage_param_imbalance", [run.param_imbalance], unit="x", better="lower")
    perf.attach("series", s.to_json())
    perf.attach("pp1_series", ref.to_json())
    perf.attach("stage_params", run.stage_params)
    perf.attach("p2p_s_by_rank", run.by_rank(m, "p2p_s"))
    perf.attach("software", {k: run.per_rank[0][k] for k in ("device", "torch", "megatron_core")})
    perf.attach("seed_reference", SEED)


@pytest.mark.parametrize("schedule, pp", PP_TREND_CASES)
def test_megatron_pipeline_bubble_trend(perf, runs, schedule, pp):
    tr = series.trend(pipeline.measure(runs, PROFILE, schedule, pp).series)
    perf.attach("trend", tr.to_json())
    assert tr.falls(min_fraction_of_theory=pipeline.min_drop_fraction(PROFILE, tr), rise_slack=pipeline.RISE_SLACK), (
        f"measured bubble did not fall as M grew: best iterations {tr.minima}, medians {tr.medians}, "
        f"theory {tr.theory}")
    perf.record("bubble_drop_vs_theory", tr.drop_vs_theory, unit="x", better="higher")
    perf.record(f"bubble_m{tr.m_lo}_over_m{tr.m_hi}", tr.lo_over_hi, unit="x", better="higher")


# -- tensor / sequence parallelism and recompute ---------------------------------------------------

@pytest.mark.parametrize("gpus", [pytest.param(g, id=f"{g}gpu-seq{TP_MODEL.seq_len}", marks=_gpu_marks(g, f"megatron-tp-{g}gpu"))
                                  for g in (2, 4, 8)])
def test_megatron_tp_sp(perf, runs, gpus):
    spec = MegatronTPSpec(world_size=gpus, cases=pipeline.tp_cases(gpus), model=TP_MODEL)
    got = pipeline.measure_tp(runs, spec)
    for name, rec in got.items():
        assert rec["loss"] and all(math.isfinite(v) for v in rec["loss"]), f"{name}: non-finite loss {rec['loss']}"
        tag = name.replace("-recompute_off", "").replace("-", "_")
        perf.record(f"{tag}_tokens_per_s", rec["tokens_per_s"], unit="tok/s", better="higher")
        perf.record(f"{tag}_peak_alloc_gib", rec["peak_alloc_gib"], unit="GiB", better="lower")
    tp1 = got[TPCase(1, gpus).name]
    for case in spec.cases:
        if case.tp == 1 or case.sequence_parallel:
            continue
        off = got[case.name]
        on = got[TPCase(case.tp, case.dp, sequence_parallel=True).name]
        perf.record(f"tp{case.tp}_vs_tp1_throughput",
                    paired_ratio(off["tokens_per_s"], tp1["tokens_per_s"], truncate=True),
                    unit="x", better="higher")
        perf.record(f"tp{case.tp}_sp_memory_saving",
                    paired_saving(on["peak_alloc_gib"], off["peak_alloc_gib"], truncate=True),
                    unit="fraction", better="higher")
        perf.record(f"tp{case.tp}_sp_throughput_ratio",
                    paired_ratio(on["tokens_per_s"], off["tokens_per_s"], truncate=True),
                    unit="x", better="higher")
    perf.attach("cases", got)
    perf.attach("seed_reference", SEED)


@pytest.mark.parametrize("gpus", [pytest.param(g, id=f"{g}gpu-tp2-seq{LONG_SEQ}", marks=_gpu_marks(g, f"megatron-rc-{g}gpu"))
                                  for g in (2, 4, 8)])
def test_megatron_recompute(perf, runs, gpus):
    spec = MegatronTPSpec(world_size=gpus, cases=pipeline.recompute_cases(gpus), model=TP_MODEL.with_seq_len(LONG_SEQ))
    got = pipeline.measure_tp(runs, spec)
    for name, rec in got.items():
        assert rec["loss"] and all(math.isfinite(v) for v in rec["loss"]), f"{name}: non-finite loss {rec['loss']}"
        tag = name.replace("-", "_")
        perf.record(f"{tag}_tokens_per_s", rec["tokens_per_s"], unit="tok/s", better="higher")
        perf.record(f"{tag}_peak_alloc_gib", rec["peak_alloc_gib"], unit="GiB", better="lower")
    dp = gpus // 2
    for sp in (False, True):
        off = got[TPCase(2, dp, sequence_parallel=sp, recompute=False).name]
        on = got[TPCase(2, dp, sequence_parallel=sp, recompute=True).name]
        tag = f"sp_{'on' if sp else 'off'}"
        perf.record(f"recompute_memory_saving_{tag}",
                    paired_saving(on["peak_alloc_gib"], off["peak_alloc_gib"], truncate=True),
                    unit="fraction", better="higher")
        perf.record(f"recompute_throughput_ratio_{tag}",
                    paired_ratio(on["tokens_per_s"], off["tokens_per_s"], truncate=True),
                    unit="x", better="higher")
    sp_off = got[TPCase(2, dp, sequence_parallel=False).name]
    sp_on = got[TPCase(2, dp, sequence_parallel=True).name]
    perf.record("sp_memory_saving_long_seq",
                paired_saving(sp_on["peak_alloc_gib"], sp_off["peak_alloc_gib"], truncate=True),
                unit="fraction", better="higher")
    perf.attach("cases", got)
    perf.attach("seed_reference", SEED)
