"""Expert-cache hit rates on synthetic routing traces (the seed's route_overlap, on controlled locality).

Four trace families from no locality to strong locality (fixtures/route_traces.py), 5 seeds each:
one sample per seed, so a metric's spread is the spread over traces of the same family. Shape:
128 tokens x 8 MoE layers x 128 experts, k = 8 - one token touches 64 (layer, expert) keys, so
capacities start at 64 slots. Hit rates are fractions (gated with an absolute tolerance); they
are deterministic per seed, so a change means the simulator or the trace generator changed.

Hard invariants checked on every trace: Belady >= LRU, pin and admit-after-2; the LRU simulation
equals the LRU curve from stack distances; with capacity >= distinct keys both reach the
first-touch bound.
"""
from __future__ import annotations

from dataclasses import replace

import pytest

from fixtures.cases import profile_marks
from fixtures.route_traces import STANDARD, synthetic_trace
from perfgate.workloads.offload import AREA, SSD
from perfgate.workloads.offload.cache_sim import analyze

SEEDS = SSD.cache_seeds
CAPACITIES = list(SSD.cache_capacities)
SHAPE = dict(SSD.cache_shape)
POLICIES = SSD.cache_policies


@profile_marks(AREA, "ssd")  # the trace families are data of fixtures/, not machine cases: no marks of their own
@pytest.mark.parametrize("family", STANDARD, ids=[replace(s, **SHAPE).label for s in STANDARD])
def test_expert_cache(perf, family):
    per_seed = []
    for j in range(SEEDS):
        trace = synthetic_trace(replace(family, **SHAPE, seed=family.seed * 100 + j))
        result = analyze(trace, CAPACITIES + [trace.distinct], admit_n=2)
        rows = {r["capacity"]: r for r in result["policies"]}
        for c, r in rows.items():
            for other in ("lru", "pin", "admit2"):
                assert r["belady"] >= r[other] - 1e-12, f"Belady {r['belady']} < {other} {r[other]} at {c} slots"
            assert abs(r["lru"] - r["lru_stack_check"]) < 1e-12, f"LRU simulation != stack-distance LRU at {c}"
        full = rows[trace.distinct]
        bound = result["first_touch_bound"]
        assert abs(full["lru"] - bound) < 1e-12 and abs(full["belady"] - bound) < 1e-12, \
            f"capacity {trace.distinct} >= distinct, yet LRU {full['lru']} / Belady {full['belady']} != bound {bound}"
        per_seed.append(result)

    for c in CAPACITIES:
        for p in POLICIES:
            samples = [next(r[p] for r in res["policies"] if r["capacity"] == c) for res in per_seed]
            perf.record(f"{p}_hit_{c}slots", samples, unit="fraction", better="higher")
    perf.record("first_touch_bound", [r["first_touch_bound"] for r in per_seed], unit="fraction", better="higher")
    perf.record("singleton_fraction", [r["singleton_fraction"] for r in per_seed], unit="fraction", better="lower")
    for k in ("2", "4", "8"):
        perf.record(f"U{k}_read_saving", [r["U"][k]["saving"] for r in per_seed], unit="fraction", better="higher")
    perf.attach("analysis", per_seed)
