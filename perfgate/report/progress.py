"""Progress of a long sweep: tests done out of total, time spent, and an estimate of time left.

A GPU sweep runs for hours unattended; a log that shows only dots cannot say whether it
is nearly done or stuck. The plugin (controller only, so xdist prints one line, not one
per worker) feeds finished tests in here and prints :meth:`SweepProgress.line` every
``--perf-progress`` seconds. The estimate is wall-clock: time since the first test
started divided by tests done, times tests left. That counts set-up, re-measurements
and xdist parallelism as they actually happened, which a sum of test durations would not.
"""
from __future__ import annotations

import io
import time
from typing import Callable

from rich.console import Console
from rich.progress_bar import ProgressBar


_BAR = 20


def fmt_duration(seconds: float) -> str:
    """42s, 3m10s, 2h05m: short enough for a log line, exact enough for a plan."""
    s = max(0, int(round(seconds)))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class SweepProgress:
    """Counts finished tests against a total and estimates the time left."""

    def __init__(self, total: int = 0, *, budget_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.total = total
        self.budget_s = budget_s
        self._clock = clock
        self._t0: float | None = None
        self._done: set[str] = set()
        self._last_line: float | None = None
        self.has_perf_tests = False  # lines are printed for sweeps of perf tests only

    def start(self, total: int) -> None:
        """The sweep begins now with ``total`` tests (called once collection is known)."""
        self.total = max(self.total, total)
        if self._t0 is None:
            self._t0 = self._clock()

    def finished(self, nodeid: str) -> None:
        if self._t0 is None:
            self._t0 = self._clock()
        self._done.add(nodeid)

    @property
    def done(self) -> int:
        return len(self._done)

    @property
    def remaining(self) -> int:
        return max(0, self.total - self.done)

    @property
    def elapsed_s(self) -> float:
        return 0.0 if self._t0 is None else self._clock() - self._t0

    @property
    def seconds_per_test(self) -> float | None:
        return self.elapsed_s / self.done if self.done else None

    @property
    def eta_s(self) -> float | None:
        """Estimated seconds until the last test finishes; None before the first one has."""
        per = self.seconds_per_test
        if per is None:
            return None
        eta = per * self.remaining
        if self.budget_s is not None:  # the budget stops the sweep earlier
            eta = min(eta, max(0.0, self.budget_s - self.elapsed_s))
        return eta

    def due(self, interval_s: float) -> bool:
        """Whether a progress line is due: ``interval_s`` since the last one (0: every test)."""
        if not self.done or self.remaining == 0 or not self.has_perf_tests:
            return False
        now = self._clock()
        if self._last_line is not None and now - self._last_line < interval_s:
            return False
        if self._last_line is None and self._t0 is not None and now - self._t0 < interval_s:
            return False
        self._last_line = now
        return True

    def text(self) -> str:
        """The plain facts, e.g. ``12/40 tests, 3m10s elapsed, ~7m25s left (15.8 s/test)``."""
        parts = [f"{self.done}/{self.total} tests", f"{fmt_duration(self.elapsed_s)} elapsed"]
        eta, per = self.eta_s, self.seconds_per_test
        if eta is not None and per is not None:
            parts.append(f"~{fmt_duration(eta)} left ({per:.1f} s/test)")
        if self.budget_s is not None:
            left = self.budget_s - self.elapsed_s
            parts.append(f"budget {fmt_duration(self.budget_s)}: "
                         + (f"{fmt_duration(left)} left" if left > 0 else "spent, skipping the rest"))
        return ", ".join(parts)

    def line(self, color: bool = False) -> str:
        """One line, ``perfgate ━━━━━━────── 30% <text>``: a rich bar on a terminal, plain in a log."""
        frac = self.done / self.total if self.total else 0.0
        if color:
            buf = io.StringIO()
            Console(file=buf, width=_BAR, force_terminal=True, color_system="standard").print(
                ProgressBar(total=max(self.total, 1), completed=self.done, width=_BAR), end="")
            bar = buf.getvalue()
        else:  # a log file: no escape codes, and the unfinished part still visible
            k = round(frac * _BAR)
            bar = "━" * k + "─" * (_BAR - k)
        return f"perfgate {bar} {frac:4.0%} {self.text()}"
