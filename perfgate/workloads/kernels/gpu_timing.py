"""Timing one memory-bound GPU operation so that the figure is the device's, not the cache's or the host's.

- **Not the L2.** A call whose inputs are still in the L2 (60 MB on an H200) from the call
  before reads them at cache speed. Calls rotate among :func:`buffer_sets` input sets, together
  several times the L2, and every call's output is kept alive until its set comes round again,
  so each call also writes memory the previous few did not (the caching allocator cannot hand
  back the block just written).
- **Not the launch.** Device work is asynchronous: CUDA events bracket a *burst* of back-to-back
  calls (:class:`Burst`), long enough that the two event records are noise, and the time per
  call is the span over the calls. Whether the host kept the device fed during such a burst is
  measured separately (perfgate.workloads.device_time: the busy share of a profiled window of
  :data:`BUSY_BURSTS` bursts), never under the profiler while timing.
- **Not the start.** A burst begins on an idle device, which waits for the host's first launch
  (under the profiler ~0.5 ms on an H200, seen 2026-12-02): a once-per-burst latency, not a
  cost per call. Bursts and busy windows are long enough (:data:`BYTES_PER_SAMPLE`, tens of ms
  at HBM speed) that it is noise; with 2 ms bursts it read as a busy share of 0.76-0.84 for
  calls of 142 us whose timing reached 0.88 of the copy bandwidth.
- **And without the launches.** Where one launch from Python costs more than the kernel (a
  torch.compile call at 4096 tokens: 46-91 us a call for ~10 us of device work on an H200),
  the burst's span is the host's. :func:`graphed` captures one burst as a CUDA graph; its replay
  runs the same calls with no host launch between them, so that span is the kernels' own time
  (the figure a CUDA-graphed engine such as vLLM sees), beside the launched one.
- **The ceiling of this sitting.** :func:`copy_bandwidth` times a large device-to-device copy,
  counting bytes read plus bytes written, on the machine in hand: a kernel's bandwidth is judged
  as a fraction of it, not of a datasheet figure.

Nothing here knows RMSNorm: perfgate.workloads.kernels.rmsnorm_bench builds the calls.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Sequence

from perfgate.workloads import timing
from perfgate.workloads.kernels.raw import CopyProbe

ROTATE_L2_MULTIPLE = 4       # input sets rotated through hold at least this many L2s
MIN_BUFFER_SETS = 2          # even a call far larger than the L2 alternates two sets
BYTES_PER_SAMPLE = 32 << 30  # one timed burst moves about this much: ~8 ms at HBM speed
BUSY_BURSTS = 4              # bursts in one profiled window: its busy share is the calls', not the start's
MIN_CALLS, MAX_CALLS = 10, 512
FALLBACK_L2_BYTES = 64 << 20  # torch builds that do not report the L2 size: an H100/H200-sized guess

COPY_BYTES = 2 << 30         # the copy probe's buffer: 34 times an H200's L2
COPY_ROUNDS, COPIES_PER_ROUND, COPY_WARMUP = 9, 5, 3


def buffer_sets(bytes_per_call: int, l2_bytes: int) -> int:
    """Input sets to rotate among so the ones in flight hold ROTATE_L2_MULTIPLE L2s (at least 2)."""
    if bytes_per_call <= 0 or l2_bytes <= 0:
        raise ValueError(f"bytes per call and L2 size must be positive, got {bytes_per_call} and {l2_bytes}")
    return max(MIN_BUFFER_SETS, math.ceil(ROTATE_L2_MULTIPLE * l2_bytes / bytes_per_call))


def calls_per_sample(bytes_per_call: int, sets: int) -> int:
    """Calls in one timed burst: about BYTES_PER_SAMPLE moved, MIN..MAX_CALLS, a whole number of
    rotations (so the next burst starts on the set used longest ago)."""
    calls = min(MAX_CALLS, max(MIN_CALLS, math.ceil(BYTES_PER_SAMPLE / bytes_per_call)))
    return sets * math.ceil(calls / sets)


def l2_bytes(device) -> int:
    """The device's L2 size as torch reports it (FALLBACK_L2_BYTES where it does not)."""
    import torch

    return int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or FALLBACK_L2_BYTES)


class Burst:
    """``calls`` back-to-back calls of ``fn`` over the input sets, outputs kept in a ring.

    ``fn(*inputs[i % sets])`` for call i; its result replaces the ring's entry i % sets, so the
    output of a call lives until its set comes round again (fresh memory written every call)."""

    def __init__(self, fn: Callable[..., Any], inputs: Sequence[tuple], calls: int):
        if calls % len(inputs):
            raise ValueError(f"a burst of {calls} calls is not a whole number of rotations over {len(inputs)} sets")
        self.fn, self.inputs, self.calls = fn, list(inputs), calls
        self.ring: list[Any] = [None] * len(self.inputs)

    def __call__(self) -> None:
        n = len(self.inputs)
        for i in range(self.calls):
            self.ring[i % n] = self.fn(*self.inputs[i % n])

    def repeated(self, times: int) -> None:
        """``times`` bursts back to back (one profiled window of :data:`BUSY_BURSTS`)."""
        for _ in range(times):
            self()

    def timed_ms(self) -> float:
        """One burst between two CUDA events on the current stream: its span in ms on the device."""
        return timing.time_call(self, timing.DEVICE)[1] * 1e3

    def release(self) -> None:
        self.ring = [None] * len(self.inputs)


class Graphed:
    """A :class:`Burst` captured once as a CUDA graph; calling it replays the graph."""

    def __init__(self, burst: Burst, device):
        import torch

        self.burst = burst
        self.graph = torch.cuda.CUDAGraph()
        side = torch.cuda.Stream(device)  # torch's recipe: warm up on a side stream before capturing
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            burst()
        torch.cuda.current_stream(device).wait_stream(side)
        # The ring's outputs come from the graph's own memory pool from here on: a replay writes
        # them, as a launched burst writes its fresh ones.
        with torch.cuda.graph(self.graph):
            burst()

    def __call__(self) -> None:
        self.graph.replay()

    def timed_ms(self) -> float:
        """One replay between two CUDA events on the current stream: its span in ms on the device."""
        return timing.time_call(self, timing.DEVICE)[1] * 1e3

    def release(self) -> None:
        self.burst.release()
        self.graph.reset()


def graphed(burst: Burst, device) -> Graphed:
    """``burst`` as a CUDA graph (see the module docstring): the calls' device time without launches."""
    return Graphed(burst, device)


def copy_bandwidth(device) -> CopyProbe:
    """(bytes read + bytes written) / time of a COPY_BYTES device-to-device copy, per round of
    COPIES_PER_ROUND copies, after COPY_WARMUP; random data (never zeros), events around each round."""
    import torch

    gen = torch.Generator(device=device).manual_seed(20261202)
    src = torch.randn(COPY_BYTES // 2, generator=gen, device=device, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    for _ in range(COPY_WARMUP):
        dst.copy_(src)
    copies = Burst(lambda: dst.copy_(src), [()], COPIES_PER_ROUND)
    gbps = [2 * COPY_BYTES * COPIES_PER_ROUND / (copies.timed_ms() * 1e-3) / 1e9 for _ in range(COPY_ROUNDS)]
    if not torch.equal(dst, src):
        raise AssertionError("the copy probe's destination differs from its source: the device copy is broken")
    del src, dst
    torch.cuda.empty_cache()
    return CopyProbe(gbps=gbps, nbytes=COPY_BYTES, copies_per_sample=COPIES_PER_ROUND)
