"""Expert-cache hit rates on synthetic routing traces (the seed's route_overlap, on controlled locality).

Four trace families from no locality to strong locality (fixtures/route_traces.py), 5 seeds each:
one sample per seed, so a metric's spread is the spread over traces of the same family. Shape:
128 tokens x 8 MoE layers x 128 experts, k = 8 - one token touches 64 (layer, expert) keys, so
capacities start at 64 slots. Hit rates are fractions (gated with an absolute tolerance); they
are deterministic per seed, so a change means the simulator or the trace generator changed.

Hard invariants checked on every trace: Belady >= LRU, pin and admit-after-2; the LRU simulation
equals the LRU curve from stack distances; with capacity >= distinct keys both reach the
first-touch bound (checked in perfgate.workloads.offload.measurements ``cache_reduce``).
"""
from __future__ import annotations

from fixtures.cases import parametrize_cases, record
from fixtures.route_traces import STANDARD, synthetic_trace
from perfgate.workloads.offload import AREA, trace_cases


@parametrize_cases(trace_cases(STANDARD, synthetic_trace))
def test_expert_cache(perf, case):
    record(perf, AREA.run(None, case))  # a simulation: nothing of the machine is read
