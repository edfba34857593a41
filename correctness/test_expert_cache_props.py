"""Properties of the expert-cache simulator (perfgate/workloads/offload/cache_sim.py).

The hit rates the offload suite reports are only as good as the simulator, so its policies are
checked against facts that hold for every request stream:

* Belady (with bypass) is the offline optimum: no LRU, static pin or admit-after-N does better.
* With capacity >= distinct keys, LRU and Belady both miss exactly once per key: hit rate
  1 - distinct/requests (the first-touch bound).
* LRU is a stack algorithm: simulated hits equal the Mattson stack-distance count, and hits never
  fall as capacity grows; admit-after-1 is LRU.
* Traces survive their own text and JSONL formats.

A planted bug (a "Belady" that evicts the key needed *soonest*) must be caught by the first
property, with a minimal counterexample.
"""
from __future__ import annotations

import heapq

import pytest
from hypothesis import find, given
from hypothesis import strategies as st
from hypothesis.errors import NoSuchExample

from correctness.hypothesis_settings import distributed, planted
from perfgate.workloads.offload import cache_sim as cs

pytestmark = pytest.mark.cpu

keys = st.lists(st.integers(0, 9), min_size=1, max_size=80)
capacity = st.integers(1, 12)


@distributed(300)
@given(keys, capacity)
def test_belady_is_never_beaten_by_lru_pin_or_admission(stream, cap):
    best = cs.belady_hits(stream, cap)
    assert best >= cs.lru_hits(stream, cap), (stream, cap)
    assert best >= cs.pin_hits(stream, cap), (stream, cap)
    for n in (2, 3):
        assert best >= cs.admit_after_hits(stream, cap, n), (stream, cap, n)


@distributed(200)
@given(keys, st.integers(0, 5))
def test_capacity_at_least_distinct_reaches_the_first_touch_bound(stream, extra):
    distinct = len(set(stream))
    cap = distinct + extra
    bound_hits = len(stream) - distinct
    assert cs.lru_hits(stream, cap) == bound_hits
    assert cs.belady_hits(stream, cap) == bound_hits
    assert cs.pin_hits(stream, cap) == bound_hits


@distributed(200)
@given(keys, capacity)
def test_lru_equals_stack_distance_curve_and_grows_with_capacity(stream, cap):
    dists = cs.stack_distances(stream)
    assert cs.lru_hits(stream, cap) == sum(1 for d in dists if d < cap)
    assert cs.lru_hits(stream, cap + 1) >= cs.lru_hits(stream, cap)
    assert cs.belady_hits(stream, cap + 1) >= cs.belady_hits(stream, cap)
    assert cs.admit_after_hits(stream, cap, 1) == cs.lru_hits(stream, cap)


def _route_traces():
    experts = st.lists(st.integers(0, 300), min_size=1, max_size=6, unique=True)
    return st.lists(st.lists(experts, min_size=1, max_size=4), min_size=1, max_size=6).map(cs.RouteTrace.from_tokens)


@distributed(100)
@given(_route_traces())
def test_trace_round_trips_through_text_and_jsonl(trace):
    assert cs.parse_trace(trace.to_text()) == trace
    assert cs.parse_trace(trace.to_jsonl()) == trace
    assert trace.n_requests == len(trace.keys())


def test_bad_trace_line_is_named():
    with pytest.raises(cs.TraceFormatError, match=r"route\.log:2"):
        cs.parse_trace("0 0 1 2\n0 x 3\n", "route.log")


def _belady_evicting_soonest(stream, cap):
    """Planted bug: evicts the cached key whose next use is *nearest* instead of farthest."""
    nxt = cs.next_uses(stream)
    cached: dict = {}
    hits = 0
    for i, k in enumerate(stream):
        if k in cached:
            hits += 1
        elif len(cached) >= cap:
            victim = heapq.nsmallest(1, cached, key=cached.get)[0]
            del cached[victim]
        cached[k] = nxt[i]
    return hits


def test_planted_bug_evict_soonest_is_caught(planted_report):
    cases = st.tuples(keys, capacity)
    try:
        stream, cap = find(cases, lambda c: _belady_evicting_soonest(*c) < cs.lru_hits(*c), settings=planted())
    except NoSuchExample:
        pytest.fail("the Belady >= LRU property did not catch a Belady that evicts the soonest-needed key")
    assert cs.belady_hits(stream, cap) >= cs.lru_hits(stream, cap)  # the real one passes on the same case
    planted_report("belady_evicts_soonest", "test_belady_is_never_beaten_by_lru_pin_or_admission",
                   f"requests {stream}, capacity {cap}: buggy Belady {_belady_evicting_soonest(stream, cap)} hits "
                   f"< LRU {cs.lru_hits(stream, cap)}")
