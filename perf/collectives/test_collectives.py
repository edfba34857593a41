"""Collective bandwidth and latency, nccl-tests style: time, busbw, and a correctness check.

Cases and sizes: perfgate.workloads.collectives (CPU: gloo 2/4 ranks, 1 KiB .. 4 MiB; GPU:
NCCL 2/4/8 GPUs, 1 KiB .. 1 GiB, one pair per link class). Each case's reduce checks that
no rank returned a wrong element and yields time_us, busbw_gbps and time_over_p2p.
"""
from __future__ import annotations

from fixtures.cases import parametrize, record
from perfgate.workloads.collectives import AREA


@parametrize(AREA, "all_reduce")
def test_all_reduce(perf, runs, case):
    record(perf, AREA.run(runs, case))


@parametrize(AREA, "all_gather")
def test_all_gather(perf, runs, case):
    record(perf, AREA.run(runs, case))


@parametrize(AREA, "reduce_scatter")
def test_reduce_scatter(perf, runs, case):
    record(perf, AREA.run(runs, case))


@parametrize(AREA, "all_to_all")
def test_all_to_all(perf, runs, case):
    record(perf, AREA.run(runs, case))


@parametrize(AREA, "broadcast")
def test_broadcast(perf, runs, case):
    record(perf, AREA.run(runs, case))


@parametrize(AREA, "send_recv")
def test_send_recv(perf, runs, case):
    record(perf, AREA.run(runs, case))
