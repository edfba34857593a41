"""Is a distributed job still working? Heartbeats from the ranks and a hang budget sized by the work.

Why both: a fixed timeout has to fit the slowest healthy job, so a hung quick job waits
out a budget sized for the worst case (a stopped rank in an 8-12 s gloo sweep was found
after 9 minutes). Two cheaper signals find it sooner without flagging a healthy slow run:

- **Heartbeats.** Each rank's phase file (the one ``ctx.phase`` writes) is touched every
  :data:`HEARTBEAT_EVERY_S` by a thread in the rank, so the parent sees a rank that is
  stopped (SIGSTOP, a frozen VM, a process stuck in the kernel) within
  :data:`SILENT_AFTER_S`. A rank whose heartbeat stops while it keeps burning CPU (a long
  C call holding the GIL) or stays runnable (waiting for a CPU on an overloaded machine) is
  slow, not dead: it is left to the budget.
- **A budget proportional to the work.** When the job's expected duration is known (the
  caller's ``expected_s``, or the spec's own ``expected_s()``), the work may take
  ``max(30 s, 3 x expected)``; a rank alive but stuck (blocked in a collective whose peer
  never comes) is killed then. Unknown expected duration: the caller's ``timeout_s`` stays
  the only bound.
"""
from __future__ import annotations

import contextlib
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HEARTBEAT_EVERY_S = 1.0
SILENT_AFTER_S = 10.0
MIN_BUDGET_S = 30.0
BUDGET_MULTIPLE = 3.0
# A silent rank that used more CPU than this share of the silent window is busy, not frozen.
BUSY_CPU_SHARE = 0.05


def hang_budget_s(expected_s: float) -> float:
    """How long the work of a job expected to take ``expected_s`` may run before it is a hang."""
    return max(MIN_BUDGET_S, BUDGET_MULTIPLE * expected_s)


def expected_duration(spec: Any) -> float | None:
    """The spec's own estimate of its healthy work time (``spec.expected_s()``), if it has one."""
    estimate = getattr(spec, "expected_s", None)
    if not callable(estimate):
        return None
    value = float(estimate())
    return value if value > 0 else None


def start_heartbeat(path: str | os.PathLike, every_s: float = HEARTBEAT_EVERY_S) -> threading.Thread:
    """Rank side: touch ``path`` (the rank's phase file) every ``every_s`` from a daemon thread.

    A thread, not the work loop: the work may sit in one collective for minutes while
    healthy. A stopped or frozen process stops its threads too, which is what the parent
    looks for."""
    def beat() -> None:
        while True:
            with contextlib.suppress(OSError):
                os.utime(path)
            time.sleep(every_s)

    thread = threading.Thread(target=beat, name="perfgate-heartbeat", daemon=True)
    thread.start()
    return thread


@dataclass
class Silence:
    """A rank that sent no heartbeat for ``seconds`` and used no CPU meanwhile."""

    rank: int
    seconds: float
    state: str  # the process state psutil saw: "stopped", "disk-sleep", "sleeping", ...


class HeartbeatWatch:
    """Parent side: the last heartbeat of each rank, and which ranks have gone silent.

    A heartbeat is a change of the phase file's mtime, timed on the parent's own monotonic
    clock (no clock comparison between processes). The rank's CPU time is noted at each
    heartbeat, so that a silent rank can be told apart from a busy one."""

    def __init__(self, phase_paths: list[Path], pids: list[int], silent_after_s: float = SILENT_AFTER_S):
        self.paths = phase_paths
        self.pids = pids
        self.silent_after_s = silent_after_s
        now = time.monotonic()
        self._mtime: list[int | None] = [None] * len(pids)
        self._last: list[float] = [now] * len(pids)
        self._cpu: list[float | None] = [_cpu_seconds(p) for p in pids]

    def restart(self) -> None:
        """Start every rank's silence clock now (when the work clock starts)."""
        now = time.monotonic()
        self._last = [now] * len(self.pids)

    def poll(self, running: list[bool]) -> Silence | None:
        """Record new heartbeats; return the longest-silent frozen rank among the running ones."""
        now = time.monotonic()
        worst: Silence | None = None
        for r, path in enumerate(self.paths):
            try:
                mtime = path.stat().st_mtime_ns
            except OSError:
                mtime = None
            if mtime != self._mtime[r]:
                self._mtime[r], self._last[r] = mtime, now
                self._cpu[r] = _cpu_seconds(self.pids[r])
                continue
            silent = now - self._last[r]
            if not running[r] or silent < self.silent_after_s:
                continue
            cpu = _cpu_seconds(self.pids[r])
            if cpu is not None and self._cpu[r] is not None and cpu - self._cpu[r] > BUSY_CPU_SHARE * silent:
                continue  # busy without beating (GIL held in a long call): slow, not dead
            state = _state(self.pids[r])
            if state == "running":
                continue  # runnable, waiting for a CPU on an overloaded machine: slow, not dead
            if worst is None or silent > worst.seconds:
                worst = Silence(r, silent, state)
        return worst


def _cpu_seconds(pid: int) -> float | None:
    try:
        import psutil

        t = psutil.Process(pid).cpu_times()
        return t.user + t.system
    except Exception:  # noqa: BLE001 - gone or unreadable: no evidence of being busy
        return None


def _state(pid: int) -> str:
    try:
        import psutil

        return str(psutil.Process(pid).status())
    except Exception:  # noqa: BLE001
        return "unknown"
