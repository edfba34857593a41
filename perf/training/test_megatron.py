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
recompute on/off at sequence length 4096 with TP=2. Cases, checks and records:
perfgate/workloads/pipeline (``cases``, ``measure``) and its ``records`` (the reduce).
"""
from __future__ import annotations

from fixtures.cases import parametrize, record
from perfgate.workloads.pipeline import AREA


# -- pipeline ------------------------------------------------------------------------------------

@parametrize(AREA, "megatron_bubble")
def test_megatron_pipeline_bubble(perf, runs, case):
    record(perf, AREA.run(runs, case))


@parametrize(AREA, "megatron_trend")
def test_megatron_pipeline_bubble_trend(perf, runs, case):
    record(perf, AREA.run(runs, case))


# -- tensor / sequence parallelism and recompute ---------------------------------------------------

@parametrize(AREA, "megatron_tp_sp")
def test_megatron_tp_sp(perf, runs, case):
    record(perf, AREA.run(runs, case))


@parametrize(AREA, "megatron_recompute")
def test_megatron_recompute(perf, runs, case):
    record(perf, AREA.run(runs, case))
