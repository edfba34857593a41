"""The seam between perf tests and workloads: each area's reduce (the one place per-rank
results are combined), paired ratios, the starved-client rule. Pure functions, hand-made inputs."""
from __future__ import annotations

import pytest

from perfgate.judge.metrics import DEPENDS_DEVICE, MetricError, paired_ratio, paired_saving
from perfgate.workloads import collectives, kernels, offload, pipeline, serving, training
from perfgate.workloads.area import Case, CheckFailed, Measured
from perfgate.workloads.pipeline import records as pipeline_records
from perfgate.workloads.serving.starvation import STARVED_MS, starved, unstarved_runs


def test_paired_ratio_pairs_step_by_step():
    assert paired_ratio([2.0, 9.0], [1.0, 3.0]) == [2.0, 3.0]
    assert paired_ratio([2.0, 9.0, 4.0], [1.0, 3.0], truncate=True) == [2.0, 3.0]
    assert paired_saving([1.0, 3.0], [2.0, 4.0]) == [0.5, 0.25]
    with pytest.raises(MetricError, match="cannot pair 3 samples with 2"):
        paired_ratio([1.0, 2.0, 3.0], [1.0, 2.0])
    with pytest.raises(MetricError, match="zero in the denominator"):
        paired_ratio([1.0], [0.0])


def _rank(times, wrong, size=1024, calls=None):
    return {"size_bytes": size, "count": 256, "iters": 10, "graph": False, "bus_factor": 1.5,
            "time_us": times, "call_us": calls or times, "ref_us": [t / 2 for t in times], "wrong": wrong}


def _case(size=1024):
    return next(c for c in collectives.AREA.all_cases("all_reduce") if c.values.size == size)


def test_collectives_reduce_takes_the_slowest_rank_and_checks_wrong_elements():
    out = {r.name: r for r in collectives.reduce(_case(), [_rank([10.0, 30.0], 0), _rank([20.0, 15.0], 0)])}
    assert out["time_us"].samples == [20.0, 30.0]
    assert out["time_over_p2p"].samples == [2.0, 2.0]  # over the slowest rank's p2p: 10, 15
    # the ratio is of median calls (call_us), not of the mean per call that bandwidth is (time_us): a
    # sample whose mean one stalled call doubled keeps its ratio (issue 47)
    stalled = {r.name: r for r in collectives.reduce(_case(), [_rank([40.0], 0, calls=[20.0]), _rank([20.0], 0)])}
    assert stalled["time_us"].samples == [40.0] and stalled["time_over_p2p"].samples == [1.0]
    algbw = 1024 / 20e-6 / 1e9
    assert out["sample"].data["algbw_gbps"][0] == pytest.approx(algbw)
    assert out["busbw_gbps"].samples[0] == pytest.approx(1.5 * algbw)
    assert out["busbw_gbps"].record_kwargs() == {"name": "busbw_gbps", "samples": out["busbw_gbps"].samples,
                                                 "unit": "GB/s", "better": "higher"}
    with pytest.raises(CheckFailed, match=r"2 wrong elements at 1KiB on 2 ranks \(per rank: \[0, 2\]\)"):
        collectives.reduce(_case(), [_rank([10.0], 0), _rank([20.0], 2)])
    with pytest.raises(ValueError, match="ranks disagree"):
        collectives.reduce(_case(), [_rank([1.0], 0), _rank([1.0, 2.0], 0)])


def test_measured_forwards_every_record_keyword():
    m = Measured("step_ms", (1.0, 2.0), "ms", "lower", tol=0.2, depends=DEPENDS_DEVICE, device_busy=0.5)
    assert m.record_kwargs() == {"name": "step_ms", "samples": [1.0, 2.0], "unit": "ms", "better": "lower",
                                 "tol": 0.2, "depends": "device", "device_busy": 0.5}
    # left at None, a keyword is left out: the recorder's default (the unit's), as before the fields existed
    assert Measured("n", [3], "count", "lower").record_kwargs() == {"name": "n", "samples": [3], "unit": "count",
                                                                    "better": "lower"}
    with pytest.raises(ValueError, match="better must be"):
        Measured("x", [1.0], "x", "up")


def test_measured_checks_depends_and_the_busy_share_as_the_reduce_builds_it():
    """A misspelt ``depends`` or a busy share outside [0, 1] fails where the reduce makes the metric (its
    unit tests), not in a perf run on the one machine class that records it."""
    with pytest.raises(MetricError, match="metric 'peak_mib': depends must be one of nothing, family, id, device"):
        Measured("peak_mib", [1.0], "MiB", "lower", depends="gpu")
    with pytest.raises(MetricError, match="metric 'step_ms': device_busy is the share"):
        Measured("step_ms", [1.0], "ms", "lower", device_busy=96)


def test_megatron_tp_reduce_takes_the_slowest_step_and_largest_peak():
    class Spec:
        cases = [type("C", (), {"name": "tp2-dp1"})()]
        tokens_per_step = 100

    ranks = [{"cases": [{"step_s": [1.0, 4.0], "peak_alloc_gib": [3.0, 1.0], "loss": [2.0]}]},
             {"cases": [{"step_s": [2.0, 2.0], "peak_alloc_gib": [1.0, 5.0], "loss": [2.0]}]}]
    rec = pipeline_records.tp_by_case(pipeline.LaunchRaw(Spec, ranks))["tp2-dp1"]
    assert rec["step_s"] == [2.0, 4.0] and rec["peak_alloc_gib"] == [3.0, 5.0] and rec["tokens_per_s"] == [50.0, 25.0]


def test_every_area_lists_cases_with_unique_ids():
    for area in (collectives.AREA, training.AREA, pipeline.AREA, serving.AREA, offload.AREA, kernels.AREA):
        every = [c for profile in area.profiles.values() for c in area.cases(profile)]
        keys = [(c.kind, c.id) for c in every]
        assert keys and len(keys) == len(set(keys)), area.name
        for kind in {c.kind for c in every}:  # every kind parametrizes a test: the reduce knows it
            assert area.all_cases(kind), (area.name, kind)


def test_unstarved_runs_re_runs_starved_ones_up_to_a_limit():
    medians = iter([0.0, 5.0, 0.05, 6.0])
    kept, every = unstarved_runs(lambda i: next(medians), starved, wanted=2, extra=3)
    assert kept == [5.0, 6.0] and every == [0.0, 5.0, 0.05, 6.0]
    kept, every = unstarved_runs(lambda i: 0.0, starved, wanted=1, extra=2)
    assert kept == [] and len(every) == 3
    assert starved(3.0, STARVED_MS) and not starved(3.0, 0.2)


def _bubble_case():
    return Case("torch-gpipe-gloo-pp2-m4", pipeline.PipelineCase(pipeline.TORCH_CPU, "gpipe", 2, 4), ("cpu",),
                kind="bubble")


def test_pipeline_reduce_combines_ranks_and_checks_the_schedule():
    class Spec:
        pp, virtual_stages, tokens_per_microbatch, schedule = 2, 1, 10, "gpipe"

    def rank(busy, params, calls=8):
        return {"chunk_params": {"0": params},
                "runs": [{"m": 4, "busy_s": busy, "sched_s": [1.0, 1.0], "step_s": [1.0, 2.0], "loss": [1.0, 1.0],
                          "p2p_s": [0.1, 0.2], "chunk_calls": [calls, calls]}]}

    out = {r.name: r for r in pipeline.AREA.reduce(_bubble_case(), pipeline.LaunchRaw(
        Spec, [rank([0.5, 0.5], 100), rank([0.7, 0.3], 300)]))}
    assert out["bubble"].samples == pytest.approx([0.4, 0.6])
    assert out["tokens_per_s"].samples == pytest.approx([40.0, 20.0])  # slowest rank's step: 1 s, 2 s
    assert out["stage_param_imbalance"].samples == [3.0] and out["stage_params"].data == [100, 300]
    with pytest.raises(CheckFailed, match=r"rank 1: busy-time brackets saw \[7, 7\] chunk calls per step, expected 8"):
        pipeline.AREA.reduce(_bubble_case(), pipeline.LaunchRaw(Spec, [rank([0.5, 0.5], 100), rank([0.7, 0.3], 300, 7)]))


def test_gpu_serving_models_generate_tokenizer_entries_but_for_padding(tmp_path):
    """Random weights pick any row of the embedding: the GPU profile's default models must not have
    rows that are no token beyond the padding to a multiple of 64 (the former 7B default: 96 %)."""
    pytest.importorskip("tokenizers")
    from perfgate.workloads.serving import GPU_PROFILE
    from perfgate.workloads.serving.tiny_model import SPECIAL_TOKENS, build_tiny_model
    for kind, spec in (("dense", GPU_PROFILE.dense_model), ("moe", GPU_PROFILE.moe_model)):
        built = build_tiny_model(tmp_path / kind, spec)
        entries = len(built.word_ids) + len(SPECIAL_TOKENS)
        assert 0 <= built.vocab_size - entries < 64, (kind, built.vocab_size, entries)
        assert built.load_format_args == ("--load-format", "dummy")


def _ddp_rank(label, rank, world, step_s, losses, calls=(3, 3)):
    from perfgate.workloads.training.engine import CaseResult

    return CaseResult(label=label, rank=rank, world_size=world, step_s=list(step_s), losses=list(losses),
                      allreduce_calls=list(calls), comm_blocked_s=[0.0] * len(step_s), rss_bytes=[1 << 20] * len(step_s),
                      info={"tokens_per_step": 100, "grad_accum": 2, "no_sync": True, "bucket_cap_mb": 1.0,
                            "grad_bytes_in_ready_order": [1 << 20] * 3})  # 3 buckets: the 3 calls a step


def test_training_reduce_pairs_world_n_with_world_1_and_checks_the_trajectory():
    case = next(c for c in training.AREA.all_cases("strong") if c.id == "gloo-2rank-gpt-tiny")
    raw = {"strong": [_ddp_rank("strong", r, 2, [0.5, 1.0 + r], [2.0, 1.5]) for r in range(2)],
           "world1-strong": [_ddp_rank("world1-strong", 0, 1, [1.0, 1.0], [2.0, 1.5])]}
    out = {r.name: r for r in training.AREA.reduce(case, raw)}
    assert out["step_ms"].samples == [500.0, 2000.0]             # the slowest rank per step
    assert out["speedup_x"].samples == pytest.approx([2.0, 0.5])  # tokens/s paired step by step
    assert out["scaling_efficiency"].samples == pytest.approx([1.0, 0.25])
    assert out["world1_tokens_per_s"].samples == [100.0, 100.0] and out["world2"].data["label"] == "strong"
    raw["strong"] = [_ddp_rank("strong", r, 2, [0.5, 1.0], [2.0, 1.6]) for r in range(2)]
    with pytest.raises(CheckFailed, match="world 2 losses drift from world 1 by 1.00e-01"):
        training.AREA.reduce(case, raw)


def test_no_two_test_modules_share_a_name():
    """pytest imports test modules by their file name (rootdir-relative 'prepend' mode): two files named
    alike in tests/ and perf/ stop a plain `pytest` at collection ("import file mismatch")."""
    from collections import Counter
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    names = Counter(p.name for d in ("tests", "correctness", "perf") for p in (root / d).rglob("test_*.py"))
    assert [n for n, k in names.items() if k > 1] == []
