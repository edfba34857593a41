"""What one kernel measurement returns, before any reduce: plain data, no torch or Triton.

The GPU side (perfgate.workloads.kernels.rmsnorm_bench, gpu_timing) fills these; the area's
reduce (perfgate.workloads.kernels) turns them into metrics; perfgate's own tests build them by
hand to check the reduce and the gate without a GPU.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping


@dataclass(frozen=True)
class CopyProbe:
    """A large device-to-device copy in this sitting: the memory bandwidth a kernel is held against.

    ``gbps``: one sample per round, (bytes read + bytes written) / time, in GB/s (1e9 bytes)."""

    gbps: list[float]
    nbytes: int                 # bytes of the source buffer (the copy reads and writes this many)
    copies_per_sample: int


@dataclass(frozen=True)
class ImplRun:
    """One implementation at one shape: per-call times, the device's busy share, its numerics."""

    impl: str                   # "triton" | "eager" | "compile"
    time_us: list[float]        # per round: one burst's CUDA-event span / calls in it
    busy: list[float]           # device busy share of a profiled burst (perfgate.workloads.device_time)
    rel_error: float            # ||out - ref|| / ||ref|| against the fp32 reference, fresh inputs (NaN: NaN seen)
    unwritten: int              # output elements still holding the NaN poison after the call
    # per round: one burst captured as a CUDA graph, replayed between CUDA events / calls in it (no host
    # launch between the calls: the kernels' own time); () from runs made before it was measured
    graph_time_us: tuple[float, ...] = ()


@dataclass(frozen=True)
class ShapeRun:
    """Every implementation measured at one shape in one interleaved run, and how it was timed."""

    hidden: int
    tokens: int
    impls: Mapping[str, ImplRun]
    buffer_sets: int            # input sets rotated through so the L2 cannot serve a repeated call
    calls_per_sample: int       # back-to-back calls inside one pair of CUDA events
    seed: int                   # the fresh random inputs' seed (to reproduce a numerics failure)
    l2_bytes: int
    device: str
    variant: str = "coalesced"  # the Triton kernel's access pattern ("uncoalesced": a planted bug)


@dataclass(frozen=True)
class KernelRaw:
    """What a kernels case's reduce takes: its shape's run and the sitting's copy bandwidth."""

    shape: ShapeRun
    copy: CopyProbe
