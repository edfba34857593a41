"""Tensor and data parallel serving against one GPU, same model (seed §11; 2 GPUs).

Seed (V100, 7B eager): TP=2 read -31 % output tok/s at C=1 and -16 % at C=32 with 3.2x the KV
tokens (a collective on every token, weights sharded so more memory is left for KV); DP=2 needs
load: nothing at C=32, +46 % at C=128 with DP=4. One server at a time (the GPUs): every
repetition on the 1-GPU dense server, then on the layout's. Recorded: output tok/s per C on
both and their ratio (median over repetitions), KV tokens of both and their ratio; asserted:
TP=2 has more KV tokens than TP=1. Not run yet on a 2-GPU machine (docs/serving.md). Workload
and metrics: perfgate.workloads.serving.measurements (``parallel_workload``, ``parallel_reduce``).
"""
from __future__ import annotations

from fixtures.cases import parametrize, record
from perfgate.workloads import serving


@parametrize(serving.AREA, "parallel")
def test_parallel_serving(perf, servers, case):
    record(perf, serving.AREA.run(servers, case))
