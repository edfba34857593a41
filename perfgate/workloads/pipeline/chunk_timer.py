"""Busy time of a pipeline stage: brackets around its forward/backward chunk computations.

How (the least invasive way we found): torch.distributed.pipelining schedules drive a stage
only through three methods of the stage object, ``forward_one_chunk``,
``backward_one_chunk`` and ``backward_weight_one_chunk``; their receives are waited on
before the call and their sends are posted after it. We shadow those three bound methods
on the stage *instance* with wrappers that time the call and then delegate, so the
schedule, the stage class and the communication are untouched, no profiler runs, and
the brackets contain computation only (plus the stage's own bookkeeping), never a wait
for a neighbour.

Each bracket is a perfgate.workloads.timing.Span:

* CPU: ``time.perf_counter`` brackets (wall time inside the chunk). Wall rather than
  process time on purpose: with more ranks than cores a computing stage may be descheduled,
  and that time is still "busy" in the schedule's sense (the stage is not waiting for a
  neighbour). ``time.thread_time`` is recorded beside it as a diagnostic: on CPU the
  forward and (CPU) autograd backward run on the calling thread with OMP_NUM_THREADS=1.
* GPU: a pair of CUDA events on the current stream per call, summed after a synchronize;
  the events time the GPU work between them, which starts only once the received
  activations are ready (NCCL's wait makes the compute stream wait before the start event).

The same object serves Megatron-Core as ``config.timers``: Megatron's schedules call
``config.timers('forward-compute').start()/.stop()`` (and 'backward-compute') around
exactly the same computations, so there nothing needs wrapping at all.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

from perfgate.workloads import timing

CHUNK_METHODS = {
    "forward_one_chunk": "forward",
    "backward_one_chunk": "backward",
    "backward_weight_one_chunk": "backward",
}
TORCH_BUSY = ("forward", "backward")
# Megatron-Core timer names that bracket computation (the others bracket p2p waits,
# the whole schedule, or the optimizer).
MEGATRON_BUSY = ("forward-compute", "backward-compute")


class ChunkTimer:
    """Accumulates busy time per kind ("forward", "backward") for one rank."""

    def __init__(self, cuda: bool):
        self.cuda = cuda
        self.reset()

    def _span(self) -> timing.Span:
        """A bracket: CUDA events on GPU; perf_counter with this thread's CPU time beside it on CPU."""
        return timing.Span(timing.DEVICE if self.cuda else timing.HOST, thread_time=not self.cuda)

    def reset(self) -> None:
        self._closed: list[tuple[str, timing.Span]] = []
        self._open: dict[str, list[timing.Span]] = {}
        self.unpaired = 0  # stop() without start(): counted, not raised, so a long GPU run still reports

    # -- torch.distributed.pipelining ------------------------------------------------
    def wrap_stage(self, stage: Any) -> Any:
        """Shadow the stage's chunk methods with timed ones (instance attributes only)."""
        wrapped = 0
        for name, kind in CHUNK_METHODS.items():
            method = getattr(stage, name, None)
            if method is not None:
                setattr(stage, name, self._timed(method, kind))
                wrapped += 1
        if not wrapped:
            raise RuntimeError(f"{type(stage).__name__} has none of {sorted(CHUNK_METHODS)}: "
                               "torch.distributed.pipelining changed; busy time cannot be measured")
        return stage

    def _timed(self, fn: Callable, kind: str) -> Callable:
        @functools.wraps(fn)
        def timed(*args, **kwargs):
            interval = self._span()
            try:
                return fn(*args, **kwargs)
            finally:
                interval.close()
                self._closed.append((kind, interval))
        return timed

    # -- Megatron-Core config.timers protocol ------------------------------------------
    def __call__(self, name: str, log_level: int | None = None) -> "_NamedTimer":
        return _NamedTimer(self, name)

    def _start(self, name: str) -> None:
        self._open.setdefault(name, []).append(self._span())

    def _stop(self, name: str) -> None:
        stack = self._open.get(name)
        if not stack:
            self.unpaired += 1
            return
        interval = stack.pop()
        interval.close()
        self._closed.append((name, interval))

    # -- results ---------------------------------------------------------------------
    def _sync(self) -> None:
        if self.cuda:
            import torch

            torch.cuda.synchronize()

    def seconds_by_kind(self) -> dict[str, float]:
        """Summed seconds per kind/timer name (synchronizes the GPU first)."""
        self._sync()
        out: dict[str, float] = {}
        for kind, interval in self._closed:
            out[kind] = out.get(kind, 0.0) + interval.seconds()
        return out

    def calls_by_kind(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for kind, _ in self._closed:
            out[kind] = out.get(kind, 0) + 1
        return out

    def busy_s(self, names: tuple[str, ...] = TORCH_BUSY) -> float:
        """Busy seconds: the torch chunk kinds, or ``MEGATRON_BUSY`` for Megatron's compute timers."""
        return sum(s for k, s in self.seconds_by_kind().items() if k in names)

    def cpu_busy_s(self) -> float:
        """Thread CPU seconds inside the brackets (CPU only; 0.0 on GPU)."""
        return sum(interval.thread_seconds for _, interval in self._closed)


class _NamedTimer:
    """What ``config.timers(name)`` returns to Megatron: start()/stop() with an ignored barrier flag."""

    __slots__ = ("_owner", "_name")

    def __init__(self, owner: ChunkTimer, name: str):
        self._owner, self._name = owner, name

    def start(self, barrier: bool = False) -> None:
        self._owner._start(self._name)

    def stop(self, barrier: bool = False) -> None:
        self._owner._stop(self._name)
