"""The cost of a placement of a TP x PP x DP mesh (seed report §16.7: TP moved from PIX onto SYS, 3.05x).

Cases: perfgate.workloads.mesh (CPU: 8 gloo ranks, tp2-pp2-dp2; GPU: 8 GPUs, NCCL), one per
placement: the default (TP innermost) and TP across the machine's slowest link. One launch times a
TP/PP/DP phase mix on both, alternating step by step. Each case's reduce checks every rank's place
in the DeviceMesh, the exact c10d calls and bytes per dimension and the outputs, and yields per
dimension the calls, bytes and time per step; the bad placement also its time over the default's.
"""
from __future__ import annotations

from fixtures.cases import parametrize, record
from perfgate.workloads.mesh import AREA


@parametrize(AREA)
def test_mesh_placement(perf, runs, case):
    record(perf, AREA.run(runs, case))
