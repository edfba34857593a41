"""Collective bandwidth and latency, nccl-tests style: time, busbw, and a correctness check.

CPU: gloo with 2 and 4 processes, 1 KiB .. 4 MiB. GPU: NCCL on 2/4/8 GPUs, 1 KiB .. 1 GiB
(x4 steps), and on machines with more than one link class one pair per class.
"""
from __future__ import annotations

import pytest

from perfgate import hardware

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
CPU_SIZES = [KiB * 4**i for i in range(7)]            # 1 KiB .. 4 MiB
GPU_SIZES = [KiB * 4**i for i in range(10)] + [GiB]   # 1 KiB .. 256 MiB, then 1 GiB


def size_label(n: int) -> str:
    for unit, div in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= div and n % div == 0:
            return f"{n // div}{unit}"
    return f"{n}B"


def _cases():
    cases = []
    for world in (2, 4):
        for size in CPU_SIZES:
            key = f"gloo-{world}rank"
            cases.append(pytest.param("gloo", world, None, size, CPU_SIZES, id=f"{key}-{size_label(size)}",
                                      marks=[pytest.mark.cpu, pytest.mark.xdist_group(key)]))
    for world in (2, 4, 8):
        for size in GPU_SIZES:
            key = f"nccl-{world}gpu"
            cases.append(pytest.param("nccl", world, None, size, GPU_SIZES, id=f"{key}-{size_label(size)}",
                                      marks=[getattr(pytest.mark, f"{world}gpu"), pytest.mark.xdist_group(key)]))
    # Pair placements: only where the machine has more than one link class between GPUs.
    for link, pair in sorted(hardware.pair_placements().items()):
        for size in GPU_SIZES:
            key = f"nccl-2gpu-{link}"
            cases.append(pytest.param("nccl", 2, pair, size, GPU_SIZES, id=f"{key}-{size_label(size)}",
                                      marks=[getattr(pytest.mark, "2gpu"),
                                             pytest.mark.pcie if not link.startswith("NV") else pytest.mark.nvlink,
                                             pytest.mark.xdist_group(key)]))
    return cases


CASES = _cases()


def _measure(perf, collective_sweeps, op, backend, world, pair, size, sizes):
    res = collective_sweeps.get(op, backend, world, size, sizes, devices=pair, fresh=perf.attempt > 1)
    assert res["wrong"] == 0, f"{op} returned {res['wrong']} wrong elements at {size_label(size)} on {world} ranks"
    perf.record("time_us", res["time_us"], unit="us", better="lower")
    perf.record("busbw_gbps", res["busbw_gbps"], unit="GB/s", better="higher")
    perf.attach("sample", {k: res[k] for k in ("size_bytes", "count", "iters", "graph", "algbw_gbps")})


@pytest.mark.parametrize("backend, world, pair, size, sizes", CASES)
def test_all_reduce(perf, collective_sweeps, backend, world, pair, size, sizes):
    _measure(perf, collective_sweeps, "all_reduce", backend, world, pair, size, sizes)


@pytest.mark.parametrize("backend, world, pair, size, sizes", CASES)
def test_all_gather(perf, collective_sweeps, backend, world, pair, size, sizes):
    _measure(perf, collective_sweeps, "all_gather", backend, world, pair, size, sizes)


@pytest.mark.parametrize("backend, world, pair, size, sizes", CASES)
def test_reduce_scatter(perf, collective_sweeps, backend, world, pair, size, sizes):
    _measure(perf, collective_sweeps, "reduce_scatter", backend, world, pair, size, sizes)


@pytest.mark.parametrize("backend, world, pair, size, sizes", CASES)
def test_all_to_all(perf, collective_sweeps, backend, world, pair, size, sizes):
    _measure(perf, collective_sweeps, "all_to_all", backend, world, pair, size, sizes)


@pytest.mark.parametrize("backend, world, pair, size, sizes", CASES)
def test_broadcast(perf, collective_sweeps, backend, world, pair, size, sizes):
    _measure(perf, collective_sweeps, "broadcast", backend, world, pair, size, sizes)


@pytest.mark.parametrize("backend, world, pair, size, sizes", CASES)
def test_send_recv(perf, collective_sweeps, backend, world, pair, size, sizes):
    _measure(perf, collective_sweeps, "send_recv", backend, world, pair, size, sizes)

