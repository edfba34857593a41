"""The device under the model file: random-read latency and bandwidth vs concurrency (the seed's io_probe).

Block = one gate segment of the file's first MoE layer (589,824 B for the seed's Q4_K layout),
64 random reads per round, page cache dropped before each round, 5 rounds per cell. The seed saw
~7 ms per 1.9 MB read at any thread count and bandwidth scaling 276 MB/s -> 2.84 GB/s from 1 to 16
threads; `bw_16t_over_1t` is that scaling measured in one run, the number that says whether more
I/O threads can help on this device.
"""
from __future__ import annotations

import os
import time

import numpy as np

from fixtures.cases import parametrize, profile_marks
from perfgate.judge.metrics import paired_ratio
from perfgate.workloads.offload import AREA, SSD as P
from perfgate.workloads.offload.device_probe import rounds_as_json, summarize_rounds
from perfgate.workloads.offload.page_cache import drop_cache, open_for_reads, resident_fraction
from perfgate.workloads.offload.read_pool import Arena, pread_exact


def _per_round(rounds, key):
    return [summarize_rounds([r])[key] for r in rounds]


@profile_marks(AREA, "ssd")
def test_page_cache_drop_reaches_device(perf, expert_file, expert_layout, cache_drop):
    """A read after DONTNEED goes to the device: mincore says the pages are gone (and, as a control,
    present after the read), and the read is clearly slower than the same read from the cache.
    Gates nothing on CPU: it is a check of the measurement method (asserted above); its two
    timings are absolute and gated on GPU hardware ids only."""
    layers, n_experts = expert_layout.layer_ids, expert_layout.n_experts
    longest = max(lt.bytes_per_expert["gate"] for lt in expert_layout.layers)  # quant types may vary by layer
    fd = open_for_reads(expert_file["path"])
    buf = Arena(longest).views([longest])[0]
    cold, cached, resident, resident_after = [], [], [], []
    try:
        for i in range(9):
            s = expert_layout.expert(layers[i % len(layers)], (7 * i) % n_experts).gate
            view = buf[:s.length]
            drop_cache(fd, s.offset // 4096 * 4096, s.length + 8192)
            resident.append(resident_fraction(expert_file["path"], s.offset, s.length))
            t0 = time.perf_counter()
            pread_exact(fd, s.offset, view)
            cold.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            pread_exact(fd, s.offset, view)
            cached.append(time.perf_counter() - t0)
            resident_after.append(resident_fraction(expert_file["path"], s.offset, s.length))
            drop_cache(fd, s.offset // 4096 * 4096, s.length + 8192)
    finally:
        os.close(fd)
    assert max(resident) == 0.0, f"pages still cached after DONTNEED: {resident}"
    assert min(resident_after) == 1.0, f"mincore does not see pages just read ({resident_after}): the check is blind"
    cold_med, cached_med = float(np.median(cold)), float(np.median(cached))
    assert cold_med > 2 * cached_med, (
        f"a read after dropping the cache ({cold_med * 1e3:.3f} ms) is not clearly slower than a cached "
        f"read ({cached_med * 1e3:.3f} ms): the drop does not reach the device here")
    perf.record("cold_read_ms", [x * 1e3 for x in cold], unit="ms", better="lower")
    perf.record("cached_read_ms", [x * 1e3 for x in cached], unit="ms", better="lower")
    perf.attach("file", {"path": str(expert_file["path"]), "source": expert_file["source"],
                         "bytes": expert_file["bytes"], "write_s": expert_file["write_s"],
                         "drop_s": cache_drop["drop_s"], "segment_bytes": longest})


@parametrize(AREA, "device_probe")
def test_device_probe(perf, device_probe, expert_layout, case):
    """One cell of the seed's table. Gated on CPU: the reads in flight the threads reached (above one
    thread). The 1-thread cell gates nothing on CPU: its figures are absolute timings of a shared
    VM's disk (gated on GPU hardware ids) and its concurrency is 1.0 by construction."""
    threads, block = case.values, expert_layout.segment_bytes[0]
    rounds = [device_probe.round(threads, block, P.probe_reads_per_round) for _ in range(P.probe_rounds)]
    if threads > 1:
        perf.record("reads_in_flight", [r.in_flight for r in rounds], unit="x", better="higher")
    perf.record("read_median_ms", _per_round(rounds, "median_ms"), unit="ms", better="lower")
    perf.record("read_mean_ms", _per_round(rounds, "mean_ms"), unit="ms", better="lower")
    perf.record("read_p90_ms", _per_round(rounds, "p90_ms"), unit="ms", better="lower")
    perf.record("read_p99_ms", _per_round(rounds, "p99_ms"), unit="ms", better="lower")
    perf.record("aggregate_mbps", _per_round(rounds, "aggregate_mbps"), unit="MB/s", better="higher")
    perf.attach("summary", summarize_rounds(rounds))
    perf.attach("rounds", rounds_as_json(rounds))


@profile_marks(AREA, "ssd")
def test_device_probe_scaling(perf, device_probe, expert_layout):
    """Aggregate bandwidth at 16 threads over 1 thread, rounds interleaved so drift hits both."""
    block = expert_layout.segment_bytes[0]
    one, many = [], []
    for _ in range(9):
        one.append(device_probe.round(1, block, 2 * P.probe_reads_per_round))
        many.append(device_probe.round(16, block, 2 * P.probe_reads_per_round))
    ratio = paired_ratio([m.aggregate_mbps for m in many], [o.aggregate_mbps for o in one])
    perf.record("bw_16t_over_1t", ratio, unit="x", better="higher")
    # The concurrency the 16-thread rounds reached (1-thread rounds are 1.0 by construction): a
    # probe that stops using its threads reads ~1 here whatever the device does.
    perf.record("reads_in_flight_16t", [m.in_flight for m in many], unit="x", better="higher")
    perf.record("aggregate_mbps_1t", [r.aggregate_mbps for r in one], unit="MB/s", better="higher")
    perf.record("aggregate_mbps_16t", [r.aggregate_mbps for r in many], unit="MB/s", better="higher")


@parametrize(AREA, "small_read_probe")
def test_small_read_probe(perf, device_probe, case):
    """4 KiB random reads: the device's latency floor (seed: 0.57 ms, 1,457 IOPS at 1 thread).
    The 1-thread case gates nothing on CPU (absolute timings; concurrency 1.0 by construction)."""
    threads = case.values
    rounds = [device_probe.round(threads, 4096, 256) for _ in range(P.probe_rounds)]
    if threads > 1:
        perf.record("reads_in_flight", [r.in_flight for r in rounds], unit="x", better="higher")
    perf.record("read_median_us", [x * 1e3 for x in _per_round(rounds, "median_ms")], unit="us", better="lower")
    perf.record("read_p99_us", [x * 1e3 for x in _per_round(rounds, "p99_ms")], unit="us", better="lower")
    perf.record("iops", _per_round(rounds, "iops"), unit="IOPS", better="higher")
    perf.attach("summary", summarize_rounds(rounds))
