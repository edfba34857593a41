"""Pipeline bubble with torch.distributed.pipelining: GPipe, 1F1B, interleaved 1F1B (issue 9).

CPU: gloo, PP 2 and 4 (one process per stage, OMP_NUM_THREADS=1), the 8-layer CPU GPT.
GPU: NCCL, PP 2/4/8, the seed report's 163M PP model in bf16. M in {1, 4, 16} wherever the
schedule accepts it (torch's Schedule1F1B refuses M < PP). Profiles, cases and the
per-rank arithmetic: perfgate.workloads.pipeline.

One launch per PP degree runs every schedule and every M and returns every iteration; the
tests read their slice. What is gated (ratios measured inside one launch):

* ``bubble`` and ``bubble_vs_theory`` per M: the measured idle fraction and its ratio to
  (PP-1)/(M+PP-1) (interleaved: (PP-1)/(v*M+PP-1)).
* ``bubble_drop_vs_theory`` per (schedule, PP): how much of the drop that theory predicts
  from the smallest to the largest M was measured. Plus a hard invariant: the bubble falls
  from the smallest to the largest M by at least a fifth of theory's drop and never rises
  from one M to the next beyond noise (judged on each M's least-disturbed iteration). It
  fails honestly when stages do not overlap (a serialised schedule keeps the bubble at
  (PP-1)/PP for every M) or when the busy-time brackets are wired wrong.
* ``speedup_vs_pp1``: the same model trained by one process on the same microbatches,
  timed in the same launch, interleaved with the pipeline steps.

Which of these gate on which machine is the tolerance files' business, not this file's: on
the shared 2-core CPU machine (baselines/cpu-*/tolerances.toml) the timing tolerances are
wider, and the speedup, the stage-time imbalance and the trend ratios of runs whose
theoretical drop is within the CPU noise are recorded but not gated.

Correctness: the pipeline's losses and every stage's gradients equal a single-process run.
The checks and the records of each test: perfgate/workloads/pipeline/records.py.
"""
from __future__ import annotations

import pytest

from fixtures.cases import parametrize, record
from perfgate.workloads.pipeline import AREA
from perfgate.workloads.pipeline.bubble import theoretical_bubble
from perfgate.workloads.pipeline.layout import ParallelLayout
from perfgate.workloads.pipeline.stages import CPU_CONFIG
from perfgate.workloads.pipeline.torch_pp import TorchPipelineSpec


@parametrize(AREA, "bubble")
def test_pipeline_bubble(perf, runs, case):
    record(perf, AREA.run(runs, case))


@parametrize(AREA, "trend")
def test_pipeline_bubble_trend(perf, runs, case):
    record(perf, AREA.run(runs, case))


@parametrize(AREA, "matches")
def test_pipeline_matches_single_process(runs, case):
    assert AREA.run(runs, case) == []  # checks only: the reduce raises on any disagreement


# -- layouts and theory: no process is started -------------------------------------------------

INVALID = [
    pytest.param(dict(world_size=2, tp=2, pp=2), r"tp 2 x pp 2 x dp 1 = 4 ranks, but world size is 2", id="tp-pp-dp-vs-world"),
    pytest.param(dict(world_size=2, pp=2, microbatches=1, schedule="1f1b"), r"M 1 < PP 2", id="1f1b-m-below-pp"),
    pytest.param(dict(world_size=4, pp=4, microbatches=2, schedule="1f1b"), r"M 2 < PP 4", id="1f1b-m2-pp4"),
    pytest.param(dict(world_size=2, pp=2, microbatches=4, virtual_stages=2, schedule="interleaved-1f1b",
                      num_layers=6), r"num_layers 6 .* pp 2 x virtual_stages 2 = 4", id="interleaved-layers"),
    pytest.param(dict(world_size=2, pp=2, microbatches=4, virtual_stages=1, schedule="interleaved-1f1b"),
                 r"virtual_stages >= 2", id="interleaved-without-chunks"),
    pytest.param(dict(world_size=4, pp=4, microbatches=6, virtual_stages=2, schedule="interleaved-1f1b",
                      engine="megatron"), r"M 6, PP 4", id="megatron-interleaved-m-not-multiple"),
    pytest.param(dict(world_size=8, pp=8, microbatches=4, virtual_stages=2, schedule="interleaved-1f1b",
                      engine="megatron"), r"M 4, PP 8", id="megatron-interleaved-m-below-pp"),
    pytest.param(dict(world_size=2, tp=1, dp=2, sequence_parallel=True, engine="megatron"), r"tp 1",
                 id="sp-without-tp"),
    pytest.param(dict(world_size=4, tp=2, pp=2, engine="torch", microbatches=4), r"tp 2, dp 1", id="torch-with-tp"),
]


@pytest.mark.cpu
@pytest.mark.parametrize("kwargs, message", INVALID)
def test_pipeline_layout_rejects(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ParallelLayout(**kwargs)


@pytest.mark.cpu
def test_pipeline_spec_rejects_before_launch():
    """An impossible run fails while its spec is built, in this process: no rank is ever started."""
    with pytest.raises(ValueError, match=r"torch Schedule1F1B needs microbatches >= pp: got M 1 < PP 4"):
        TorchPipelineSpec(pp=4, schedule="1f1b", model=CPU_CONFIG, microbatches=(1, 4, 16))


@pytest.mark.cpu
@pytest.mark.parametrize("pp, m, v, expected", [
    pytest.param(2, 1, 1, 1 / 2, id="pp2-m1"),
    pytest.param(4, 4, 1, 3 / 7, id="pp4-m4"),
    pytest.param(8, 16, 1, 7 / 23, id="pp8-m16-seed-30.4pct"),
    pytest.param(4, 4, 2, 3 / 11, id="pp4-v2-m4"),             # interleaved, M >= PP
    pytest.param(4, 16, 2, 3 / 35, id="pp4-v2-m16"),
    pytest.param(4, 1, 2, 3 / 4, id="pp4-v2-m1"),              # interleaved, M < PP: fill and drain
    pytest.param(8, 4, 2, 1 - 8 / 19, id="pp8-v2-m4"),
])
def test_pipeline_bubble_theory(pp, m, v, expected):
    assert theoretical_bubble(pp, m, v) == pytest.approx(expected)


@pytest.mark.cpu
def test_pipeline_bubble_arithmetic():
    """The measured-bubble arithmetic on hand-made timings (two stages, two iterations)."""
    from perfgate.workloads.pipeline.bubble import measured_bubble, per_iteration

    assert measured_bubble([0.6, 0.4], 1.0) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="exceeds the step's wall time"):
        measured_bubble([1.2, 0.4], 1.0)
    it = per_iteration([{"busy_s": [0.6, 0.3], "sched_s": [1.0, 0.5], "step_s": [1.1, 0.6]},
                        {"busy_s": [0.2, 0.3], "sched_s": [0.8, 0.6], "step_s": [0.9, 0.7]}])
    assert it["wall_s"] == [1.0, 0.6]  # the slowest rank ends the step
    assert it["bubble"] == pytest.approx([0.6, 0.5])
    assert it["busy_imbalance"] == pytest.approx([3.0, 1.0])
