"""MoE expert-parallel all-to-all under routing skew (seed report §16.4).

Cases: perfgate.workloads.moe (CPU: gloo 2/4 ranks; GPU: NCCL 2/4/8 GPUs), one per routing
distribution: uniform, zipf1.2, one hot expert (hot0.5). One launch per world times all of them
and a balanced reference interleaved step by step; each case's reduce checks the combined output
against a reference computed without communication and every token slot's delivery, and yields
per-rank dispatch/combine times, step time over the balanced reference (and over uniform), the
slowest over the fastest rank's expert time, and the combine's share of waiting for peers.
"""
from __future__ import annotations

from fixtures.cases import parametrize, record
from perfgate.workloads.moe import AREA


@parametrize(AREA)
def test_moe_all_to_all(perf, runs, case):
    record(perf, AREA.run(runs, case))
