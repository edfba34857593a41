"""The storage device's character: latency and aggregate bandwidth of random reads vs concurrency.

The seed's first lesson (docs/05 section 1): one 1.9 MB random read took ~7 ms at any thread count,
while aggregate bandwidth scaled from 276 MB/s (1 thread) to 2.84 GB/s (16 threads). So a single
stream is bandwidth-limited, and only *independent* concurrent reads help. This module measures the
same table on any file: per round, `n_reads` random block-aligned reads of `block_bytes`, spread
over `threads` threads, with the file's page cache dropped before the round (or O_DIRECT), and
4 KiB random reads for raw latency and IOPS.

Offsets are distinct within a round and 4 KiB aligned, drawn over the whole file, so buffered
rounds never hit pages read earlier in the same round.
"""
from __future__ import annotations

import os
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from perfgate import mutations

from .page_cache import DIRECT_ALIGN, drop_cache, open_for_reads
from .read_pool import Arena, PooledFile

DEFAULT_THREADS = (1, 2, 4, 8, 12, 16)


@dataclass(frozen=True)
class ProbeRound:
    """Raw timings of one round: what every summary is derived from."""

    threads: int
    block_bytes: int
    direct: bool
    latencies_s: tuple[float, ...]
    wall_s: float

    @property
    def n_reads(self) -> int:
        return len(self.latencies_s)

    @property
    def aggregate_mbps(self) -> float:
        return self.n_reads * self.block_bytes / self.wall_s / 1e6

    @property
    def iops(self) -> float:
        return self.n_reads / self.wall_s

    @property
    def in_flight(self) -> float:
        """Mean reads in flight over the round (sum of read latencies / wall): the queue depth
        the device saw. ~1 for one thread; it can only grow if reads are really issued concurrently."""
        return sum(self.latencies_s) / self.wall_s


def summarize_rounds(rounds: list[ProbeRound]) -> dict:
    """Latency percentiles over all reads of the rounds, and bandwidth over their summed wall time."""
    lat_ms = np.array([x for r in rounds for x in r.latencies_s]) * 1e3
    wall = sum(r.wall_s for r in rounds)
    n = len(lat_ms)
    return {
        "threads": rounds[0].threads,
        "block_bytes": rounds[0].block_bytes,
        "direct": rounds[0].direct,
        "n_reads": n,
        "median_ms": float(np.median(lat_ms)),
        "mean_ms": float(lat_ms.mean()),
        "p90_ms": float(np.percentile(lat_ms, 90)),
        "p99_ms": float(np.percentile(lat_ms, 99)),
        "aggregate_mbps": n * rounds[0].block_bytes / wall / 1e6,
        "iops": n / wall,
    }


def random_offsets(rng: random.Random, file_bytes: int, block_bytes: int, n: int,
                   align: int = DIRECT_ALIGN) -> list[int]:
    """n distinct aligned offsets whose reads of block_bytes lie inside the file (and do not overlap)."""
    slot = -(-block_bytes // align) * align
    slots = file_bytes // slot
    if slots < 1:
        raise ValueError(f"file of {file_bytes} bytes is smaller than one {block_bytes}-byte read")
    if n > slots:
        raise ValueError(f"{n} distinct reads of {block_bytes} bytes do not fit in {file_bytes} bytes")
    return [s * slot for s in rng.sample(range(slots), n)]


@dataclass
class DeviceProbe(PooledFile):
    """Open file + read pools; one `round()` call measures one (threads, block) cell."""

    path: Path
    direct: bool = False
    seed: int = 0
    max_threads: int = 64
    _pools: dict = field(default_factory=dict, repr=False)

    def __post_init__(self):
        self.path = Path(self.path)
        self.file_bytes = self.path.stat().st_size
        self.fd = open_for_reads(self.path, direct=self.direct)
        self.rng = random.Random(self.seed)
        self.arena = Arena(1)


    def round(self, threads: int, block_bytes: int, n_reads: int = 64) -> ProbeRound:
        """Drop the cache, then n_reads random reads over `threads` threads."""
        if not 1 <= threads <= self.max_threads:
            raise ValueError(f"threads must be 1..{self.max_threads}, got {threads}")
        if mutations.active("probe_ignores_threads"):
            threads = 1
        length = -(-block_bytes // DIRECT_ALIGN) * DIRECT_ALIGN if self.direct else block_bytes
        offsets = random_offsets(self.rng, self.file_bytes, length, n_reads)
        # every read has its own destination, as expert slots in a pager would
        if Arena.bytes_needed([length] * n_reads) > self.arena.nbytes:
            self.arena = Arena(Arena.bytes_needed([length] * n_reads))
        views = self.arena.views([length] * n_reads)
        chains = [[(off, view)] for off, view in zip(offsets, views)]
        if not self.direct:
            drop_cache(self.fd)
        if threads == 1:  # the calling thread reads: no wake-up cost in the single-stream baseline
            return self._single_thread_round([c[0] for c in chains], block_bytes)
        pool = self.pool(threads)
        wall = pool.run(self.fd, chains)
        return ProbeRound(threads, block_bytes, self.direct, tuple(pool.chain_s), wall)

    def _single_thread_round(self, reads, block_bytes: int) -> ProbeRound:
        import time

        from .read_pool import pread_exact

        lat = []
        t0 = time.perf_counter()
        for off, view in reads:
            t = time.perf_counter()
            pread_exact(self.fd, off, view)
            lat.append(time.perf_counter() - t)
        return ProbeRound(1, block_bytes, self.direct, tuple(lat), time.perf_counter() - t0)

    def sweep(self, block_bytes: int, threads=DEFAULT_THREADS, n_reads: int = 64, rounds: int = 1,
              progress=None) -> dict[int, list[ProbeRound]]:
        """The seed's table: for each thread count, `rounds` rounds of n_reads."""
        out: dict[int, list[ProbeRound]] = {}
        for t in threads:
            out[t] = [self.round(t, block_bytes, n_reads) for _ in range(rounds)]
            if progress:
                progress(t)
        return out



def rounds_as_json(rounds: list[ProbeRound]) -> list[dict]:
    return [asdict(r) for r in rounds]


def stream(path: str | Path, block_bytes: int, threads: int, duration_s: float, *, direct: bool = True,
           seed: int = 0) -> dict:
    """fio-like closed loop: `threads` threads each pread random block-aligned blocks until the
    deadline (the same access pattern as `fio --rw=randread --ioengine=psync --numjobs=threads
    --norandommap`). Returns bytes, wall seconds, MB/s, IOPS.

    With direct=False the page cache is dropped once at the start; later repeats of an offset may
    then hit the cache, so compare with fio only under O_DIRECT.
    """
    import threading
    import time

    from .read_pool import pread_exact

    size = Path(path).stat().st_size
    length = -(-block_bytes // DIRECT_ALIGN) * DIRECT_ALIGN if direct else block_bytes
    slots = size // length
    fd = open_for_reads(path, direct=direct)
    if not direct:
        drop_cache(fd)
    arena = Arena(Arena.bytes_needed([length] * threads))
    views = arena.views([length] * threads)
    counts = [0] * threads
    start = threading.Barrier(threads + 1)
    deadline = [0.0]

    def worker(i: int) -> None:
        rng = random.Random(seed * 1000 + i)
        view = views[i]
        start.wait()
        n = 0
        end = deadline[0]
        while time.perf_counter() < end:
            pread_exact(fd, rng.randrange(slots) * length, view)
            n += 1
        counts[i] = n

    workers = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(threads)]
    try:
        for w in workers:
            w.start()
        t0 = time.perf_counter()
        deadline[0] = t0 + duration_s
        start.wait()
        for w in workers:
            w.join()
        wall = time.perf_counter() - t0
    finally:
        os.close(fd)
    total = sum(counts) * length
    return {"threads": threads, "block_bytes": length, "direct": direct, "reads": sum(counts),
            "wall_s": wall, "mbps": total / wall / 1e6, "iops": sum(counts) / wall}
