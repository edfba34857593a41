"""How busy the GPUs were during a wall-clock window, from NVML's own utilization samples.

A vLLM server is a process perfgate does not control: torch.profiler cannot see its kernels.
NVML keeps, per GPU, a ring of utilization samples (the share of each sample period, about a
sixth of a second, during which a kernel ran), read through nvidia-ml-py without touching the
server. The busy share of a serving phase is the mean of the samples that fall inside it, on the
busiest GPU (the one serving). A phase shorter than a few sample periods, a machine without NVML
or without a GPU gives no figure (``fraction`` None, ``reason`` says why): never an error, since a
missing busy share must not fail a measurement.

What it is good for: beside a serving timing it says whether the server kept the device busy
(device-bound, >= 0.9: perfgate.workloads.device_time.DEVICE_BOUND) or the host held it back
(scheduler, API server, Python). It is coarser than the kernel-interval union of device_time,
which is why training steps use that instead.
"""
from __future__ import annotations

import contextlib
import statistics
import time
from dataclasses import dataclass
from typing import Iterator

MIN_SAMPLES = 3  # fewer samples in a window say too little (one period is ~167 ms)


@dataclass
class BusyWindow:
    # the busiest GPU's utilization samples (percent) inside the window, even too few for a fraction:
    # phases too short for a share of their own are pooled by the caller (pooled_share)
    percents: tuple[int, ...] = ()
    reason: str | None = None  # why there is no fraction

    @property
    def fraction(self) -> float | None:
        """The window's busy share, or None for fewer than MIN_SAMPLES samples."""
        return pooled_share(self.percents)


def _gpu_handles():
    import pynvml

    pynvml.nvmlInit()
    return pynvml, [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]


def pooled_share(percents) -> float | None:
    """Mean utilization (0..1) of percent samples, or None for fewer than MIN_SAMPLES. Pure; also what
    pools the samples of several short windows of one phase into one share (serving.busy_records)."""
    percents = list(percents)
    if len(percents) < MIN_SAMPLES:
        return None
    return min(1.0, max(0.0, statistics.fmean(percents) / 100.0))


def inside(samples: list[tuple[int, int]], start_us: int, end_us: int) -> list[int]:
    """The percents of the ``(timestamp_us, percent)`` samples stamped inside [start, end]. Pure: the
    NVML part only fetches the samples."""
    return [pct for ts, pct in samples if start_us <= ts <= end_us]


def _samples(pynvml, handle) -> list[tuple[int, int]]:
    _, raw = pynvml.nvmlDeviceGetSamples(handle, pynvml.NVML_GPU_UTILIZATION_SAMPLES, 0)
    return [(int(s.timeStamp), int(s.sampleValue.uiVal)) for s in raw]


@contextlib.contextmanager
def busy_window() -> Iterator[BusyWindow]:
    """``with busy_window() as w: ...`` then ``w.fraction``: the busiest GPU's busy share of the block.

    NVML stamps samples with its own microsecond clock; the window is placed on that clock by
    the newest sample read at the start and at the end (so a clock that is not the wall clock
    still works), and falls back to the wall clock when NVML returned nothing at the start."""
    w = BusyWindow()
    try:
        pynvml, handles = _gpu_handles()
    except Exception as exc:  # noqa: BLE001 - no NVML, no driver, no GPU: no figure, never an error
        w.reason = f"no NVML here ({type(exc).__name__}: {exc})"[:200]
        yield w
        return
    if not handles:
        w.reason = "NVML sees no GPU"
        yield w
        return
    try:
        marks = [max((ts for ts, _ in _samples(pynvml, h)), default=None) for h in handles]
    except Exception as exc:  # noqa: BLE001
        marks = [None] * len(handles)
        w.reason = f"NVML samples unreadable ({type(exc).__name__}: {exc})"[:200]
    wall0 = time.time_ns() // 1000
    try:
        yield w
    finally:
        wall1 = time.time_ns() // 1000
        per_gpu = []
        try:
            for h, mark in zip(handles, marks):
                got = _samples(pynvml, h)
                if not got:
                    continue
                start = mark if mark is not None else wall0
                end = max(ts for ts, _ in got) if mark is not None else wall1
                percents = inside(got, start + 1, end)
                if percents:
                    per_gpu.append(percents)
            if per_gpu:  # the busiest GPU: the one serving
                w.percents = tuple(max(per_gpu, key=statistics.fmean))
            if w.fraction is not None:
                w.reason = None
            elif w.reason is None:
                w.reason = f"fewer than {MIN_SAMPLES} NVML utilization samples in the window ({(wall1 - wall0) / 1e6:.2f} s)"
        except Exception as exc:  # noqa: BLE001
            w.reason = f"NVML samples unreadable ({type(exc).__name__}: {exc})"[:200]
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()
