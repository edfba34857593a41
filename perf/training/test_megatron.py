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

from perfgate.launch import launch
from perfgate.workloads.pipeline import summary
from perfgate.workloads.pipeline.layout import ParallelLayout
from perfgate.workloads.pipeline.megatron_common import PP_MODEL, TP_MODEL
from perfgate.workloads.pipeline.megatron_pp import MegatronPipelineSpec
from perfgate.workloads.pipeline.megatron_tp import MegatronTPSpec, TPCase

MS = (1, 4, 16)
PP_TARGET = "perfgate.workloads.pipeline.megatron_pp:run_many"
TP_TARGET = "perfgate.workloads.pipeline.megatron_tp:run"
VIRTUAL = {"1f1b": 1, "interleaved-1f1b": 2}
LONG_SEQ = 4096
# Trend invariant, as in test_pipeline.py: the bubble falls by at least this share of theory's drop.
MIN_DROP_FRACTION = 0.20
RISE_SLACK = 0.05
# Seed report (8x V100 PCIe, Megatron-Core 0.9.0), kept beside our numbers for the report.
SEED = {
    "pp_speedup_pp8_m16": 2.59, "pp_theory_bubble_pp8_m16": 0.304, "pp_param_imbalance_pp8": 2.76,
    "sp_memory_saving_tp2_seq4096": 0.013, "recompute_memory_saving_tp2_seq4096": 0.781,
    "recompute_throughput_cost_tp2_seq4096": 0.297,
}


def _valid_ms(schedule: str, pp: int) -> tuple[int, ...]:
    ok = []
    for m in MS:
        try:
            ParallelLayout(world_size=pp, pp=pp, microbatches=m, virtual_stages=VIRTUAL[schedule],
                           schedule=schedule, engine="megatron", num_layers=PP_MODEL.num_layers)
        except ValueError:
            continue
        ok.append(m)
    return tuple(ok)


def _pp_spec(schedule: str, pp: int) -> MegatronPipelineSpec:
    return MegatronPipelineSpec(pp=pp, schedule=schedule, microbatches=_valid_ms(schedule, pp),
                                virtual_stages=VIRTUAL[schedule])


def _pp_id(schedule: str, pp: int) -> str:
    v = VIRTUAL[schedule]
    return f"megatron-{schedule}-nccl-pp{pp}" + (f"-v{v}" if v > 1 else "")


def _gpu_marks(gpus: int, key: str) -> list:
    return [pytest.mark.megatron, getattr(pytest.mark, f"{gpus}gpu"), pytest.mark.xdist_group(key)]


PP_RUNS = [(s, p) for s in VIRTUAL for p in (2, 4, 8) if _valid_ms(s, p)]
PP_M_CASES = [pytest.param(s, p, m, id=f"{_pp_id(s, p)}-m{m}", marks=_gpu_marks(p, f"megatron-pp{p}"))
              for s, p in PP_RUNS for m in _valid_ms(s, p)]
PP_TREND_CASES = [pytest.param(s, p, id=_pp_id(s, p), marks=_gpu_marks(p, f"megatron-pp{p}"))
                  for s, p in PP_RUNS if len(_valid_ms(s, p)) >= 2]


def tp_cases(gpus: int) -> tuple[TPCase, ...]:
    """Every (TP, DP) with TP x DP = gpus; SP off and on for TP >= 2 (seed §7.1)."""
    cases = []
    tp = 1
    while tp <= gpus:
        if gpus % tp == 0 and TP_MODEL.num_attention_heads % tp == 0:
            cases.append(TPCase(tp, gpus // tp, sequence_parallel=False))
            if tp >= 2:
                cases.append(TPCase(tp, gpus // tp, sequence_parallel=True))
        tp *= 2
    return tuple(cases)


def recompute_cases(gpus: int) -> tuple[TPCase, ...]:
    """TP=2 (the seed's smallest TP), DP = gpus / 2: recompute off/on, with SP off and on (seed §7.5)."""
    return tuple(TPCase(2, gpus // 2, sequence_parallel=sp, recompute=rc)
                 for sp in (False, True) for rc in (False, True))


class MegatronRuns:
    """Session cache: one launch per pipeline PP degree (both schedules), the PP=1 reference, each TP job.

    ``fresh=True`` (a perfgate re-measurement) launches again instead of re-reading.
    """

    def __init__(self):
        self._cache: dict[tuple, object] = {}

    def _get(self, key, make, fresh):
        if fresh or key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]

    def pipeline(self, schedule: str, pp: int, *, fresh: bool = False):
        """Both schedules of one PP degree come from one launch (unless re-measuring one)."""
        key = ("pp", schedule, pp)
        if fresh or key not in self._cache:
            schedules = (schedule,) if fresh else tuple(s for s in VIRTUAL if _valid_ms(s, pp))
            specs = tuple(_pp_spec(s, pp) for s in schedules)  # validated before any rank starts
            per_rank = launch(PP_TARGET, specs, world_size=pp, backend="nccl", timeout_s=900)
            for i, spec in enumerate(specs):
                results = [rank_results[i] for rank_results in per_rank]
                self._cache[("pp", spec.schedule, pp)] = (spec, results, summary.series_by_m(
                    results, pp=pp, virtual_stages=spec.virtual_stages,
                    tokens_per_microbatch=spec.tokens_per_microbatch))
        return self._cache[key]

    def pp1(self, *, fresh: bool = False) -> dict[int, summary.MSeries]:
        """PP=1 on one GPU (Megatron's no-pipelining schedule) for the speedup reference."""
        def make():
            spec = MegatronPipelineSpec(pp=1, schedule="1f1b", microbatches=MS)
            per_rank = launch(PP_TARGET, (spec,), world_size=1, backend="nccl", timeout_s=900)
            results = [rank_results[0] for rank_results in per_rank]
            return summary.series_by_m(results, pp=1, virtual_stages=1,
                                       tokens_per_microbatch=spec.tokens_per_microbatch)
        return self._get(("pp1",), make, fresh)

    def tp(self, spec: MegatronTPSpec, *, fresh: bool = False) -> dict[str, dict]:
        def make():
            per_rank = launch(TP_TARGET, spec, world_size=spec.world_size, backend="nccl", timeout_s=900)
            # Step times are already max-reduced over ranks; memory is per rank: take the largest.
            out = {}
            for i, case in enumerate(spec.cases):
                rec = dict(per_rank[0]["cases"][i])
                rec["peak_alloc_gib"] = [max(r["cases"][i]["peak_alloc_gib"][k] for r in per_rank)
                                         for k in range(len(rec["peak_alloc_gib"]))]
                rec["tokens_per_s"] = [spec.tokens_per_step / s for s in rec["step_s"]]
                out[case.name] = rec
            return out
        return self._get(("tp", spec), make, fresh)


@pytest.fixture(scope="session")
def megatron_runs() -> MegatronRuns:
    return MegatronRuns()


# -- pipeline ------------------------------------------------------------------------------------

@pytest.mark.parametrize("schedule, pp, m", PP_M_CASES)
def test_megatron_pipeline_bubble(perf, megatron_runs, schedule, pp, m):
    spec, per_rank, series = megatron_runs.pipeline(schedule, pp, fresh=perf.attempt > 1)
    s = series[m]
    expected_calls = 2 * m * spec.virtual_stages
    for rank, calls in enumerate(s.chunk_calls_by_rank):
        assert all(c == expected_calls for c in calls), (
            f"rank {rank}: Megatron's compute timers fired {calls} times per step, expected {expected_calls}")
    unpaired = [r["runs"][list(series).index(m)]["unpaired_timer_stops"] for r in per_rank]
    assert not any(unpaired), f"Megatron stopped timers it never started: {unpaired} per rank"
    assert s.loss and all(math.isfinite(v) for v in s.loss), f"non-finite loss at M={m}: {s.loss}"
    ref = megatron_runs.pp1(fresh=perf.attempt > 1)[m]
    n = min(len(ref.tokens_per_s), len(s.tokens_per_s))
    perf.record("bubble", s.bubble, unit="fraction", better="lower")
    perf.record("bubble_vs_theory", s.bubble_vs_theory, unit="x", better="lower")
    perf.record("tokens_per_s", s.tokens_per_s, unit="tok/s", better="higher")
    perf.record("speedup_vs_pp1", [s.tokens_per_s[i] / ref.tokens_per_s[i] for i in range(n)],
                unit="x", better="higher")
    perf.record("stage_time_imbalance", s.busy_imbalance, unit="x", better="lower")
    perf.record("stage_param_imbalance", [summary.param_imbalance(per_rank)], unit="x", better="lower")
    perf.attach("series", s.to_json())
    perf.attach("pp1_series", ref.to_json())
    perf.attach("stage_params", summary.stage_params(per_rank))
    perf.attach("p2p_s_by_rank", [r["runs"][list(series).index(m)]["p2p_s"] for r in per_rank])
    perf.attach("software", {k: per_rank[0][k] for k in ("device", "torch", "megatron_core")})
    perf.attach("seed_reference", SEED)


@pytest.mark.parametrize("schedule, pp", PP_TREND_CASES)
def test_megatron_pipeline_bubble_trend(perf, megatron_runs, schedule, pp):
    _spec, _per_rank, series = megatron_runs.pipeline(schedule, pp, fresh=perf.attempt > 1)
    tr = summary.trend(series)
    perf.attach("trend", tr.to_json())
    assert tr.falls(min_fraction_of_theory=MIN_DROP_FRACTION, rise_slack=RISE_SLACK), (
        f"measured bubble did not fall as M grew: best iterations {tr.minima}, medians {tr.medians}, "
        f"theory {tr.theory}")
    perf.record("bubble_drop_vs_theory", tr.drop_vs_theory, unit="x", better="higher")
    perf.record(f"bubble_m{tr.m_lo}_over_m{tr.m_hi}", tr.lo_over_hi, unit="x", better="higher")


# -- tensor / sequence parallelism and recompute ---------------------------------------------------

def _ratio_samples(a: list[float], b: list[float]) -> list[float]:
    n = min(len(a), len(b))
    return [a[i] / b[i] for i in range(n)]


def _saving_samples(on: list[float], off: list[float]) -> list[float]:
    n = min(len(on), len(off))
    return [1.0 - on[i] / off[i] for i in range(n)]


@pytest.mark.parametrize("gpus", [pytest.param(g, id=f"{g}gpu-seq{TP_MODEL.seq_len}", marks=_gpu_marks(g, f"megatron-tp-{g}gpu"))
                                  for g in (2, 4, 8)])
def test_megatron_tp_sp(perf, megatron_runs, gpus):
    spec = MegatronTPSpec(world_size=gpus, cases=tp_cases(gpus), model=TP_MODEL)
    runs = megatron_runs.tp(spec, fresh=perf.attempt > 1)
    for name, rec in runs.items():
        assert rec["loss"] and all(math.isfinite(v) for v in rec["loss"]), f"{name}: non-finite loss {rec['loss']}"
        tag = name.replace("-recompute_off", "").replace("-", "_")
        perf.record(f"{tag}_tokens_per_s", rec["tokens_per_s"], unit="tok/s", better="higher")
        perf.record(f"{tag}_peak_alloc_gib", rec["peak_alloc_gib"], unit="GiB", better="lower")
    tp1 = runs[TPCase(1, gpus).name]
    for case in spec.cases:
        if case.tp == 1 or case.sequence_parallel:
            continue
        off = runs[case.name]
        on = runs[TPCase(case.tp, case.dp, sequence_parallel=True).name]
        perf.record(f"tp{case.tp}_vs_tp1_throughput", _ratio_samples(off["tokens_per_s"], tp1["tokens_per_s"]),
                    unit="x", better="higher")
        perf.record(f"tp{case.tp}_sp_memory_saving", _saving_samples(on["peak_alloc_gib"], off["peak_alloc_gib"]),
                    unit="fraction", better="higher")
        perf.record(f"tp{case.tp}_sp_throughput_ratio", _ratio_samples(on["tokens_per_s"], off["tokens_per_s"]),
                    unit="x", better="higher")
    perf.attach("cases", runs)
    perf.attach("seed_reference", SEED)


@pytest.mark.parametrize("gpus", [pytest.param(g, id=f"{g}gpu-tp2-seq{LONG_SEQ}", marks=_gpu_marks(g, f"megatron-rc-{g}gpu"))
                                  for g in (2, 4, 8)])
def test_megatron_recompute(perf, megatron_runs, gpus):
    spec = MegatronTPSpec(world_size=gpus, cases=recompute_cases(gpus), model=TP_MODEL.with_seq_len(LONG_SEQ))
    runs = megatron_runs.tp(spec, fresh=perf.attempt > 1)
    for name, rec in runs.items():
        assert rec["loss"] and all(math.isfinite(v) for v in rec["loss"]), f"{name}: non-finite loss {rec['loss']}"
        tag = name.replace("-", "_")
        perf.record(f"{tag}_tokens_per_s", rec["tokens_per_s"], unit="tok/s", better="higher")
        perf.record(f"{tag}_peak_alloc_gib", rec["peak_alloc_gib"], unit="GiB", better="lower")
    dp = gpus // 2
    for sp in (False, True):
        off = runs[TPCase(2, dp, sequence_parallel=sp, recompute=False).name]
        on = runs[TPCase(2, dp, sequence_parallel=sp, recompute=True).name]
        tag = f"sp_{'on' if sp else 'off'}"
        perf.record(f"recompute_memory_saving_{tag}", _saving_samples(on["peak_alloc_gib"], off["peak_alloc_gib"]),
                    unit="fraction", better="higher")
        perf.record(f"recompute_throughput_ratio_{tag}", _ratio_samples(on["tokens_per_s"], off["tokens_per_s"]),
                    unit="x", better="higher")
    sp_off = runs[TPCase(2, dp, sequence_parallel=False).name]
    sp_on = runs[TPCase(2, dp, sequence_parallel=True).name]
    perf.record("sp_memory_saving_long_seq", _saving_samples(sp_on["peak_alloc_gib"], sp_off["peak_alloc_gib"]),
                unit="fraction", better="higher")
    perf.attach("cases", runs)
    perf.attach("seed_reference", SEED)
