"""Collective bandwidth and latency, nccl-tests style: time, busbw, and a correctness check.

Cases and sizes: perfgate.workloads.collectives (CPU: gloo 2/4 ranks, 1 KiB .. 4 MiB; GPU:
NCCL 2/4/8 GPUs, 1 KiB .. 1 GiB, one pair per link class).
"""
from __future__ import annotations

import pytest

from fixtures.cases import params
from perfgate.workloads import collectives

CASES = params(collectives.AREA.all_cases())


def _measure(perf, runs, op, backend, world, pair, size, sizes):
    res = collectives.measure(runs, op, backend, world, size, sizes, devices=pair)
    assert res["wrong"] == 0, (f"{op} returned {res['wrong']} wrong elements at {collectives.size_label(size)} "
                               f"on {world} ranks (per rank: {res['wrong_by_rank']})")
    perf.record("time_us", res["time_us"], unit="us", better="lower")
    perf.record("busbw_gbps", res["busbw_gbps"], unit="GB/s", better="higher")
    # Gated on every machine: the collective's time over one ring send/recv of the same bytes,
    # timed right after each sample by the same ranks, so a loaded machine moves both alike.
    perf.record("time_over_p2p", res["time_over_p2p"], unit="x", better="lower")
    perf.attach("sample", {k: res[k] for k in ("size_bytes", "count", "iters", "graph", "algbw_gbps")})


@pytest.mark.parametrize("backend, world, pair, size, sizes", CASES)
def test_all_reduce(perf, runs, backend, world, pair, size, sizes):
    _measure(perf, runs, "all_reduce", backend, world, pair, size, sizes)


@pytest.mark.parametrize("backend, world, pair, size, sizes", CASES)
def test_all_gather(perf, runs, backend, world, pair, size, sizes):
    _measure(perf, runs, "all_gather", backend, world, pair, size, sizes)


@pytest.mark.parametrize("backend, world, pair, size, sizes", CASES)
def test_reduce_scatter(perf, runs, backend, world, pair, size, sizes):
    _measure(perf, runs, "reduce_scatter", backend, world, pair, size, sizes)


@pytest.mark.parametrize("backend, world, pair, size, sizes", CASES)
def test_all_to_all(perf, runs, backend, world, pair, size, sizes):
    _measure(perf, runs, "all_to_all", backend, world, pair, size, sizes)


@pytest.mark.parametrize("backend, world, pair, size, sizes", CASES)
def test_broadcast(perf, runs, backend, world, pair, size, sizes):
    _measure(perf, runs, "broadcast", backend, world, pair, size, sizes)


@pytest.mark.parametrize("backend, world, pair, size, sizes", CASES)
def test_send_recv(perf, runs, backend, world, pair, size, sizes):
    _measure(perf, runs, "send_recv", backend, world, pair, size, sizes)
