"""Watch the machine while perf tests measure: numbers taken beside someone else's job are tainted.

The preflight (perfgate.machine.preflight) looks once, before the session. A job that
starts later, half-way through a sweep, slows whatever is measuring then; on a 2-core box
one foreign busy process beside two gloo ranks takes a third of their CPU, and the gate
saw a regression that a quiet re-run did not have (issue 27, item 8). So every window in
which numbers are measured is watched too, and judged with the preflight's Limits: foreign
CPU use above ``max_foreign_cpu_fraction_while_measuring`` of the cores (lower than the
preflight's limit: while our work fills the cores a foreign job only gets its fair share,
and all of it was taken from us) or hypervisor steal above ``max_steal_fraction`` taints
the numbers measured in it. Tainted metrics are shown with the reason and are not gated
(never a regression) and never become baselines.

Which window measured a test's numbers? They come from two places, and each is watched:

* **Launches shared through the session cache** (perfgate.runcache): one launch measures a
  whole sweep, during whichever test first asked for it; later tests only read its
  results. Watching the reading test would judge the wrong minute (a test that reads a
  cached result spends a millisecond on it). So each production of the cache is a window
  of its own, and its reasons are stored with the entries it made: every test that reads
  them, then or later, carries them. A re-measurement drops the entries and with them their
  taint; the fresh launch is watched afresh.
* **The test body itself** (a test that times a loop in-process, or does anything between
  its cache reads): the call phase is a window (and each re-measurement another), minus the
  cache productions nested in it, which are judged on their own as above.

A window is judged only when it lasted ``min_watched_s`` (0.5 s) and our processes used that
much CPU time in it: a test that only reads the cache, or records numbers it did not time,
measured nothing there, however long a busy machine kept it waiting.

Cost: a window reads the counters twice (start, end: /proc/stat, our process tree, one
pass over /proc for every other process's CPU time), about 10 ms each on a quiet box, both
outside anything timed. No thread samples in between: cumulative counters are exact,
catch processes that live and die inside the window, and count our ranks that ended in it
as ours (through their parents' reaped-children times).
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Iterator

from perfgate.machine.cpu_use import CpuCounters, CpuUse, read_cpu_counters, usable_cores
from perfgate.machine.preflight import Limits, cpu_reasons

WHILE_TEST = " while this test measured"
WHILE_LAUNCH = " while the launch whose results this test read measured"


@dataclass
class Window:
    """One watched span. ``use`` (its own part, without nested windows) and ``reasons`` are
    set when it closes; a disabled watch leaves them empty."""

    during: str
    use: CpuUse | None = None
    reasons: list[str] = field(default_factory=list)
    # cores' worth of CPU that others took in it (foreign processes plus hypervisor steal): what a
    # tainted figure's load bound is computed from (perfgate.judge.load_bound); None: not judged
    foreign_cores: float | None = None


@dataclass
class _Open:
    window: Window
    start: CpuCounters
    nested: CpuUse = field(default_factory=CpuUse)


class LoadWatch:
    """Windows over the session's measurements; ``enabled=False`` (``--perf-preflight off``) reads nothing."""

    def __init__(self, limits: Limits | None = None, *, enabled: bool = True):
        self.limits = limits or Limits()
        self.enabled = enabled
        self.cores = usable_cores()
        self._open: list[_Open] = []

    @contextlib.contextmanager
    def window(self, during: str = WHILE_TEST) -> Iterator[Window]:
        """Watch the ``with`` block; windows opened inside it are subtracted from it and judged alone."""
        window = Window(during)
        if not self.enabled:
            yield window
            return
        frame = _Open(window, read_cpu_counters(self.limits.ignore_pids))
        self._open.append(frame)
        try:
            yield window
        finally:
            self._open.remove(frame)
            total = read_cpu_counters(self.limits.ignore_pids) - frame.start
            if self._open:
                self._open[-1].nested = self._open[-1].nested + total
            window.use = total - frame.nested
            window.reasons = self.judge(window.use, during)
            window.foreign_cores = self.taken_cores(window.use)

    def measured(self, use: CpuUse) -> bool:
        """Whether the window lasted long enough, and our processes worked enough in it, to have measured."""
        return use.elapsed_s >= self.limits.min_watched_s and use.own_s >= self.limits.min_watched_s

    def judge(self, use: CpuUse, during: str) -> list[str]:
        """Why numbers measured in ``use`` are not comparable; empty when the machine was quiet,
        or when the window was too short, or our processes too idle in it, to have measured anything."""
        if not self.measured(use):
            return []
        return cpu_reasons(use.sample(self.cores), self.limits, during=during)

    def taken_cores(self, use: CpuUse) -> float | None:
        """Cores' worth of CPU others took in ``use``: processes not ours plus hypervisor steal; None where
        the window measured nothing."""
        if not self.measured(use):
            return None
        sample = use.sample(self.cores)
        return sample.foreign_cores + sample.steal_fraction * sample.cores
