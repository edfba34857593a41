"""How far a busy machine can move a figure: past that, a tainted figure still fails.

A figure measured while other processes took CPU is *tainted* and not gated (perfgate.judge.policy):
load moves it. But load moves it only so far. On a 2-core box where others took 0.9 of a core, a
collective planted 4x slower read ``time_over_p2p`` 1.26 -> 6.38 (+408 %) and passed as
``worse (tainted)`` (issue 47): no share of two cores explains five times the time. So a tainted
figure that would be gated on a quiet machine fails when it is worse than its baseline by more than
what the measured load can explain:

    explained = (1 + tolerance) x C / (C - L)

C is the cores we may run on; L the cores' worth of CPU time that others took while the figure was
measured (processes that are not ours, plus hypervisor steal), in the busiest window that measured it
(perfgate.machine.load_watch). The model: a figure set by CPU work finishes that work on the capacity
others leave, C - L cores at the least, instead of C, so its time stretches by at most C / (C - L)
(and a throughput shrinks by as much); the tolerance already absorbs what a quiet machine's runs
differ by. A ratio of two timings measured side by side in one run (``time_over_p2p``, a speedup)
has each side stretched by a factor between 1 and C / (C - L), so it too moves by at most that.

What the bound does not cover, and so where it is generous rather than tight: L is an average over
its window (a launch that measures a sweep, a test body), so a burst during one size is spread over
all; the model counts CPU time, not caches, memory bandwidth or the wake-up latency of a rank that a
busy core delays (a latency-bound timing can lose more than its CPU share; a ratio to a reference
timed beside it loses both alike). Where those matter the tolerance is the place to say so. Only
CPU load is bounded: a figure tainted by the preflight check (a GPU shared with another process,
throttled clocks, low memory: perfgate.machine.preflight) stays not gated, since nothing measured
says how much that can explain. Fractions (absolute tolerances) and figures recorded only (absolute
figures on CPU ids) are not bounded either; exact counts and structural figures are never tainted.
The measured check is in docs/reliability.md.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from perfgate.judge.guard import worsening_factor
from perfgate.judge.verdict import Outcome, Verdict


@dataclass(frozen=True)
class ForeignLoad:
    """The CPU others took while a figure was measured: ``foreign_cores`` of the machine's ``cores``."""

    cores: int
    foreign_cores: float

    def __post_init__(self):
        if not (isinstance(self.cores, int) and self.cores >= 1):
            raise ValueError(f"cores must be a positive count, got {self.cores!r}")
        if not (math.isfinite(self.foreign_cores) and self.foreign_cores >= 0):
            raise ValueError(f"foreign_cores must be a finite number >= 0, got {self.foreign_cores!r}")

    @property
    def stretch(self) -> float:
        """C / (C - L): the most the load can stretch CPU work; inf when others took every core."""
        free = self.cores - self.foreign_cores
        return math.inf if free <= 0 else self.cores / free


def explained_factor(load: ForeignLoad, tol: float) -> float:
    """The worst worsening, as a factor, that ``tol`` and ``load`` together explain."""
    return (1.0 + tol) * load.stretch


def beyond_load(verdict: Verdict, load: ForeignLoad | None, *, current_median: float, better: str,
                tol: float) -> Verdict | None:
    """The failing verdict of a tainted figure whose regression ``load`` cannot explain, else None.

    ``verdict`` is what the figure would get on a quiet machine (a regression: significant and beyond
    ``tol``); it fails here only when its median is also more than :func:`explained_factor` worse."""
    if load is None or verdict.outcome is not Outcome.REGRESSION or verdict.baseline_median is None:
        return None
    moved = worsening_factor(verdict.baseline_median, current_median, better)
    limit = explained_factor(load, tol)
    if not moved > limit:  # 1.0 where a factor means nothing (a zero or negative baseline)
        return None
    shown = "inf" if math.isinf(moved) else f"{moved:.2f}"
    return replace(verdict, explanation=(
        f"{shown}x worse on a busy machine, beyond the {limit:.2f}x its load explains: others took "
        f"{load.foreign_cores:.2f} of {load.cores} cores while it was measured, which stretches CPU work by at most "
        f"{load.cores}/({load.cores} - {load.foreign_cores:.2f}) = {load.stretch:.2f}x, times 1 + tolerance "
        f"{tol:.0%}; {verdict.explanation}"))
