"""The multi-node launch path, measured end to end on one machine (docs/multinode.md).

Two torchrun agents act as two nodes (c10d rendezvous on 127.0.0.1, one gloo rank each,
``perfgate.launch.multinode`` with the ``local`` launcher); the collectives worker all-reduces
1 KiB across them, and the collectives area's reduce checks every element and yields the same
metrics as the single-node tests. It proves the path a cluster run takes (job folder, agents,
rendezvous, results in global rank order), not a bandwidth: marker ``cpu``, so CI runs it; the
``multinode`` marker is for tests that need real nodes (PERFGATE_NNODES >= 2).
"""
from __future__ import annotations

from fixtures.cases import parametrize, record
from perfgate.workloads.collectives import AREA


@parametrize(AREA, "all_reduce_multinode")
def test_all_reduce_multinode(perf, runs, case):
    record(perf, AREA.run(runs, case))
