"""The device under the model file: random-read latency and bandwidth vs concurrency (the seed's io_probe).

Block = one gate segment of the file's first MoE layer (589,824 B for the seed's Q4_K layout),
64 random reads per round, page cache dropped before each round, 5 rounds per cell. The seed saw
~7 ms per 1.9 MB read at any thread count and bandwidth scaling 276 MB/s -> 2.84 GB/s from 1 to 16
threads; `bw_16t_over_1t` is that scaling measured in one run, the number that says whether more
I/O threads can help on this device. Reads, checks and metrics: perfgate.workloads.offload.measurements
(``drop_*``, ``probe_*``, ``scaling_*``).
"""
from __future__ import annotations

from fixtures.cases import parametrize, profile_marks, record
from perfgate.workloads.offload import AREA

(DROP_CASE,) = AREA.all_cases("page_cache_drop")
(SCALING_CASE,) = AREA.all_cases("probe_scaling")


@profile_marks(AREA, "ssd")
def test_page_cache_drop_reaches_device(perf, offload_io):
    """A read after DONTNEED goes to the device: mincore says the pages are gone (and, as a control,
    present after the read), and the read is clearly slower than the same read from the cache.
    Gates nothing on CPU: it is a check of the measurement method (checked in its reduce); its two
    timings are absolute and gated on GPU hardware ids only."""
    record(perf, AREA.run(offload_io, DROP_CASE))


@parametrize(AREA, "device_probe")
def test_device_probe(perf, offload_io, case):
    """One cell of the seed's table. Gated on CPU: the reads in flight the threads reached (above one
    thread). The 1-thread cell gates nothing on CPU: its figures are absolute timings of a shared
    VM's disk (gated on GPU hardware ids) and its concurrency is 1.0 by construction."""
    record(perf, AREA.run(offload_io, case))


@profile_marks(AREA, "ssd")
def test_device_probe_scaling(perf, offload_io):
    """Aggregate bandwidth at 16 threads over 1 thread, rounds interleaved so drift hits both."""
    record(perf, AREA.run(offload_io, SCALING_CASE))


@parametrize(AREA, "small_read_probe")
def test_small_read_probe(perf, offload_io, case):
    """4 KiB random reads: the device's latency floor (seed: 0.57 ms, 1,457 IOPS at 1 thread).
    The 1-thread case gates nothing on CPU (absolute timings; concurrency 1.0 by construction)."""
    record(perf, AREA.run(offload_io, case))
