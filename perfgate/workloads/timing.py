"""The one way perfgate times a region: a :class:`Span` on one of two clocks, or a boundary on the host's.

Every workload measures time through this module, so what a "millisecond" means is decided once:

- ``HOST``: ``time.perf_counter`` around the region (wall time as the process sees it), and where asked
  this thread's CPU time beside it (``thread_seconds``: on CPU a rank sharing cores is descheduled; its wall
  time still counts, its thread time says how much of it computed);
- ``DEVICE``: two CUDA events recorded on the current stream around the region: its length on the GPU's own
  clock, free of the host's launch and Python time. Reading a device span waits for its end event, so spans
  recorded in a loop are read after it, without a synchronize inside.

:func:`time_call` times one call (collectives, kernels, the serving mutation's calibration); a :class:`Span`
left open across a call it wraps times a region that starts and ends in different places (pipeline chunks);
:func:`now` is the host clock read after the device drained its queue, the boundary of consecutive phases
that include device work (the MoE step's phases, a training step's window, which the energy meter also
reads: perfgate.workloads.device_energy). Which clock a workload uses is the workload's choice and part of
what its metric means; this module only keeps each clock read one way.
"""
from __future__ import annotations

import time
from typing import Any, Callable

HOST, DEVICE = "host", "device"


def clock_of(device) -> str:
    """DEVICE on a CUDA device, else HOST: the clock a region of work on ``device`` is timed by."""
    return DEVICE if getattr(device, "type", device) == "cuda" else HOST


class Span:
    """One bracket, opened when made and closed by :meth:`close`: see the module docstring for the clocks."""

    __slots__ = ("clock", "_start", "_end", "_wall0", "_thread0", "_wall_s", "_thread_s")

    def __init__(self, clock: str = HOST, *, thread_time: bool = False):
        if clock not in (HOST, DEVICE):
            raise ValueError(f"a span's clock is {HOST!r} or {DEVICE!r}, got {clock!r}")
        self.clock = clock
        self._wall_s = self._thread_s = 0.0
        if clock == DEVICE:
            import torch

            self._start, self._end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self._start.record()
        else:
            self._thread0 = time.thread_time() if thread_time else None
            self._wall0 = time.perf_counter()

    def close(self) -> "Span":
        if self.clock == DEVICE:
            self._end.record()
        else:
            self._wall_s = time.perf_counter() - self._wall0
            if self._thread0 is not None:
                self._thread_s = time.thread_time() - self._thread0
        return self

    def seconds(self) -> float:
        """The region's length in seconds (a device span: once its end event has completed)."""
        if self.clock == DEVICE:
            self._end.synchronize()
            return self._start.elapsed_time(self._end) / 1e3
        return self._wall_s

    @property
    def thread_seconds(self) -> float:
        """This thread's CPU seconds inside a host span made with ``thread_time=True`` (else 0.0)."""
        return self._thread_s


def time_call(fn: Callable[[], Any], clock: str = HOST) -> tuple[Any, float]:
    """Run ``fn`` once inside a :class:`Span` on ``clock``: its result and the span's seconds."""
    span = Span(clock)
    out = fn()
    return out, span.close().seconds()


def now(device=None) -> float:
    """The host clock (``time.perf_counter``, seconds), read once a CUDA ``device`` has finished the work
    queued on it (on CPU, at once): a boundary between phases whose work includes the device's."""
    if clock_of(device) == DEVICE:
        import torch

        torch.cuda.synchronize(device)
    return time.perf_counter()
