"""The decode critical path: reading missed experts cold from the model file.

The seed's finding (docs/05 section 2): a pager that reads one expert as three *sequential*
preads pays three device latencies in a chain (3 x 7 ms there), whatever the thread count; issuing
the three segments as independent reads cut one layer of 8 missed experts from 12.6 ms to 7.6 ms.

Strategies measured here, all on real segments from the GGUF layout, page cache dropped for the
exact byte ranges before each sample (or O_DIRECT):

* expert, "sequential": the calling thread preads gate, up, down in turn.
* expert, "parallel":   the three segments (x split chunks each) go to a pool of 3 x split threads.
* layer,  "sequential": k missed experts, one chain of three preads per expert, pool of `threads`
                         (the seed's "8 threads x sequential segments").
* layer,  "parallel":   k x 3 x split independent reads on a pool of `threads` (seed: 16/24/32).

Each sample picks fresh random experts (distinct within the sample) from one random MoE layer, as
one decode step would. Latency is wall time from issuing to the last byte; MB/s is bytes / latency.
"""
from __future__ import annotations

import os
import random
import time
from dataclasses import dataclass, field
from typing import Literal

from perfgate import mutations

from .gguf_layout import ExpertLayout, ExpertSegments, Segment
from .page_cache import DIRECT_ALIGN, PAGE, aligned_span, drop_cache, open_for_reads
from .read_pool import Arena, PooledFile, pread_exact

Mode = Literal["sequential", "parallel"]


@dataclass(frozen=True)
class ReadSpec:
    """One way to read k missed experts of one layer (k = 1 is the per-expert measurement)."""

    mode: Mode
    k: int = 1
    threads: int = 0  # 0: 1 for a sequential expert, 3*split for a parallel expert, k for a sequential layer
    split: int = 1

    def __post_init__(self):
        if self.mode not in ("sequential", "parallel"):
            raise ValueError(f"mode must be 'sequential' or 'parallel', got {self.mode!r}")
        if self.k < 1 or self.split < 1 or self.threads < 0:
            raise ValueError(f"k >= 1, split >= 1, threads >= 0 required, got {self}")
        if self.mode == "sequential" and self.split != 1:
            raise ValueError("split applies to parallel reads only (a sequential chain reads whole segments)")

    @property
    def pool_threads(self) -> int:
        if self.threads:
            return self.threads
        if self.mode == "sequential":
            return self.k if self.k > 1 else 1
        return 3 * self.split * self.k if self.k == 1 else 3 * self.k

    @property
    def label(self) -> str:
        what = "expert" if self.k == 1 else f"{self.k}exp"
        s = f"-split{self.split}" if self.split > 1 else ""
        return f"{self.mode}-{what}-{self.pool_threads}threads{s}"


def split_segment(seg: Segment, parts: int, align: int = DIRECT_ALIGN) -> list[Segment]:
    """Cut a segment into at most `parts` chunks; chunk sizes are multiples of `align`, so an
    aligned segment gives aligned chunks (O_DIRECT) and the last chunk takes the remainder."""
    if parts == 1:
        return [seg]
    chunk = -(-seg.length // parts)
    chunk = -(-chunk // align) * align
    out, pos = [], seg.offset
    while pos < seg.end:
        n = min(chunk, seg.end - pos)
        out.append(Segment(pos, n))
        pos += n
    return out


@dataclass
class ExpertReader(PooledFile):
    """Open model file, arena and pools; `sample(spec)` measures one cold read of k experts."""

    layout: ExpertLayout
    direct: bool = False
    seed: int = 0
    max_k: int = 8
    _pools: dict = field(default_factory=dict, repr=False)
    last_in_flight: float = field(default=0.0, init=False)  # of the last sample(): see sample()

    def __post_init__(self):
        self.fd = open_for_reads(self.layout.path, direct=self.direct)
        self.rng = random.Random(self.seed)
        per_expert = sum(aligned_span(0, n)[1] + 2 * DIRECT_ALIGN for n in self.layout.segment_bytes)
        self.arena = Arena(per_expert * self.max_k + 64 * DIRECT_ALIGN)


    def pick(self, k: int) -> list[ExpertSegments]:
        """k distinct random experts of one random MoE layer."""
        lt = self.rng.choice(self.layout.layers)
        if k > lt.n_experts:
            raise ValueError(f"layer {lt.layer} has {lt.n_experts} experts, cannot miss {k}")
        return [self.layout.expert(lt.layer, e) for e in self.rng.sample(range(lt.n_experts), k)]

    def _pieces(self, seg: Segment, split: int) -> list[Segment]:
        if self.direct:  # widen first, then cut at aligned boundaries: chunks never overlap
            seg = Segment(*aligned_span(seg.offset, seg.length))
        return split_segment(seg, split)

    def _drop(self, experts: list[ExpertSegments]) -> None:
        if self.direct:
            return
        for ex in experts:
            for seg in ex.segments:
                start, length = aligned_span(seg.offset, seg.length, PAGE)
                drop_cache(self.fd, start, length)

    def plan(self, experts: list[ExpertSegments], spec: ReadSpec) -> list[list[tuple[int, memoryview]]]:
        """Read chains for the spec: one chain per expert (sequential) or per piece (parallel)."""
        per_expert = [[p for seg in ex.segments for p in self._pieces(seg, spec.split)] for ex in experts]
        lengths = [p.length for pieces in per_expert for p in pieces]
        if Arena.bytes_needed(lengths) > self.arena.nbytes:
            self.arena = Arena(Arena.bytes_needed(lengths))
        views = iter(self.arena.views(lengths))
        reads = [[(p.offset, next(views)) for p in pieces] for pieces in per_expert]
        if spec.mode == "sequential" or mutations.active("sequential_segments"):
            return reads
        return [[r] for chain in reads for r in chain]

    def delivered(self, experts: list[ExpertSegments], spec: ReadSpec) -> list[tuple[bytes, bytes, bytes]]:
        """The bytes the last `sample(spec, experts)` left in the arena, per expert (gate, up, down).

        plan() hands out views in a fixed order (expert, segment, chunk), so planning again yields
        the same memory; O_DIRECT chunks cover the aligned span, which is cut back to the segment.
        """
        self.plan(experts, spec)
        views = iter(self.arena.views([p.length for ex in experts for seg in ex.segments
                                       for p in self._pieces(seg, spec.split)]))
        out = []
        for ex in experts:
            segs = []
            for seg in ex.segments:
                pieces = self._pieces(seg, spec.split)
                data = b"".join(bytes(next(views)) for _ in pieces)
                start = seg.offset - pieces[0].offset
                segs.append(data[start:start + seg.length])
            out.append(tuple(segs))
        return out

    def sample(self, spec: ReadSpec, experts: list[ExpertSegments] | None = None) -> float:
        """Seconds to read spec.k cold experts with the spec's strategy."""
        if spec.k > self.max_k:
            raise ValueError(f"reader built for k <= {self.max_k}, got {spec.k}")
        experts = experts if experts is not None else self.pick(spec.k)
        chains = self.plan(experts, spec)
        self._drop(experts)
        if spec.pool_threads == 1:  # one thread: read on the caller, no wake-up in the timing
            t0 = time.perf_counter()
            for chain in chains:
                for off, view in chain:
                    pread_exact(self.fd, off, view)
            self.last_in_flight = 1.0
            return time.perf_counter() - t0
        pool = self.pool(spec.pool_threads)
        wall = pool.run(self.fd, chains)
        # reads in flight, averaged over the sample: the queue depth the device saw
        self.last_in_flight = sum(pool.chain_s) / wall if wall > 0 else 0.0
        return wall

    def interleaved(self, specs: dict[str, ReadSpec], n: int,
                    in_flight: dict[str, list[float]] | None = None) -> dict[str, list[float]]:
        """n samples of each spec, alternating A B C A B C... so slow drift hits all alike.
        ``in_flight`` (optional) collects each sample's mean number of reads in flight per spec."""
        out: dict[str, list[float]] = {name: [] for name in specs}
        for _ in range(n):
            for name, spec in specs.items():
                out[name].append(self.sample(spec))
                if in_flight is not None:
                    in_flight.setdefault(name, []).append(self.last_in_flight)
        return out

    def bytes_of(self, spec: ReadSpec) -> int:
        return spec.k * self.layout.expert_bytes



def read_expert_bytes(path, ex: ExpertSegments) -> tuple[bytes, bytes, bytes]:
    """The three segments' bytes with plain buffered preads (for correctness checks, not timing)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        out = []
        for seg in ex.segments:
            buf = bytearray(seg.length)
            pread_exact(fd, seg.offset, memoryview(buf))
            out.append(bytes(buf))
        return tuple(out)  # type: ignore[return-value]
    finally:
        os.close(fd)
