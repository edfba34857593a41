"""The decode critical path: one missed expert, and one layer of k missed experts, read cold.

Seed (docs/05 section 2): 8 threads each reading one expert's 3 segments in sequence took 12.6 ms
per layer; the same 24 segments as independent reads took 7.6 ms (ratio 0.60). Here every
comparison is measured in one run, the two strategies interleaved sample by sample, and the gated
metric is the ratio of their medians per round (parallel / sequential, lower is better).
Absolute latencies and MB/s are recorded beside it. Strategies, rounds, the check that every
strategy delivers the file's bytes, and the ratios: perfgate.workloads.offload.measurements
(``read_measure``, ``read_reduce``).
"""
from __future__ import annotations

from fixtures.cases import parametrize, record
from perfgate.workloads.offload import AREA


@parametrize(AREA, "expert_read")
def test_expert_read(perf, offload_io, case):
    """One expert: 3 sequential preads on one thread vs the 3 segments on 3 threads."""
    record(perf, AREA.run(offload_io, case))


@parametrize(AREA, "layer_read")
def test_layer_read(perf, offload_io, case):
    """k missed experts of one layer: k threads x 3 sequential segments vs 3k reads on `threads` threads."""
    record(perf, AREA.run(offload_io, case))


@parametrize(AREA, "split_read")
def test_split_read(perf, offload_io, case):
    """Each segment in `split` chunks (the seed's SDQ_IO_SPLIT, a negative result there) vs whole segments."""
    record(perf, AREA.run(offload_io, case))
