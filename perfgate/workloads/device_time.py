"""Device time of a GPU region: how long the device worked inside it, and that share of the region.

A GPU timing must measure the GPU. If a training step takes as long at micro-batch 1 as at 8,
it is timing the host (Python, hooks, kernel launches on a shared VM), and no tolerance tighter
than the host's noise can gate it. So beside a GPU step time we record:

- ``busy_ms``: the time the device executed work inside the region: the union of the kernel,
  memcpy and memset intervals that CUPTI reports through ``torch.profiler`` (overlapping streams,
  e.g. NCCL beside compute, count once);
- ``span_ms``: the region's length on the device, between two CUDA events recorded around it;
- ``fraction`` = busy / span. At >= 0.9 the host kept the device fed: the step time is a device
  figure, comparable across hosts (perfgate.judge: ``depends="device"``). Below that the step
  is host-bound and the report says so.

The profiler runs only around the few steps measured this way, never around the timed steps,
so it cannot slow the figures that are gated.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable

from perfgate.workloads import timing

# At or above this busy share a step's time is set by the device, not the host (DESIGN.md §2): the
# judge's constant, so what a workload checks and what the judge compares across hosts never drift apart.
from perfgate.judge.metrics import DEVICE_BOUND  # noqa: E402  (re-exported: workloads read it here)


@dataclass(frozen=True)
class DeviceWindow:
    span_ms: float
    busy_ms: float

    @property
    def fraction(self) -> float:
        """Busy share of the span, at most 1 (CUPTI and CUDA-event clocks differ by microseconds)."""
        return min(1.0, self.busy_ms / self.span_ms) if self.span_ms > 0 else 0.0


def union_ms(intervals_us: Iterable[tuple[float, float]]) -> float:
    """Total length in ms of the union of [start, end) intervals given in microseconds."""
    total = 0.0
    cur_start = cur_end = None
    for start, end in sorted((s, e) for s, e in intervals_us if e > s):
        if cur_end is None or start > cur_end:
            if cur_end is not None:
                total += cur_end - cur_start
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    if cur_end is not None:
        total += cur_end - cur_start
    return total / 1000.0


def device_intervals_us(prof) -> list[tuple[float, float]]:
    """(start, end) in us of every device activity (kernels, copies, sets) a profiler session saw."""
    from torch.autograd import DeviceType

    out = []
    for evt in prof.events():
        if evt.device_type == DeviceType.CUDA:
            out.append((float(evt.time_range.start), float(evt.time_range.end)))
    return out


def measure(fn: Callable[[], Any], device) -> tuple[Any, DeviceWindow]:
    """Run ``fn`` once on an idle ``device`` and return its result and its :class:`DeviceWindow`.

    The device is synchronised before and after, so every kernel the profiler records belongs
    to ``fn``; the events bracket exactly that work on the device's own clock."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        out, span_s = timing.time_call(fn, timing.DEVICE)
        torch.cuda.synchronize(device)
    return out, DeviceWindow(span_ms=span_s * 1e3, busy_ms=union_ms(device_intervals_us(prof)))
