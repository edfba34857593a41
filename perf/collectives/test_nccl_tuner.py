"""NCCL tuner crossover (seed report §16.3): NCCL's default against forced algorithms, protocols
and channel counts, per collective and size, each setting in its own process group.

Cases: perfgate.workloads.collectives.tuner (NCCL, 2/4/8 GPUs, 1 KiB .. 256 MiB; skipped with the
reason on machines with fewer GPUs). Each case's reduce checks every setting's result (0 wrong
elements) and yields the default's busbw over the best forced setting's (gated, higher is
better) and every setting's busbw.
"""
from __future__ import annotations

from fixtures.cases import parametrize, record
from perfgate.workloads.collectives.tuner import AREA


@parametrize(AREA)
def test_nccl_tuner_default_vs_best(perf, runs, case):
    record(perf, AREA.run(runs, case))
