"""Change points in a series of run medians, by Apache Otava (E-Divisive means + Student's t).

Otava (formerly DataStax Hunter; Fleming et al., "Hunter: Using Change Point Detection to Hunt
for Performance Regressions", ICPE 2023; MongoDB's signal-processing-algorithms before it) is
what nightly-performance teams run over exactly this kind of series: it splits a series where
the means on both sides differ most (E-Divisive, over sliding windows), keeps a split when a
two-sided t-test between the neighbouring segments has p < ``max_pvalue`` and the relative
change exceeds ``min_magnitude``, and re-tests neighbours after each removal. Unlike a
"k runs beyond the tolerance" rule it needs no reference window or run length, finds a step
the day it has enough runs on each side, and gives each change a p-value.

One series per (hardware id, test, metric): the run medians of perfgate.report.trends
(which reads the history, orders it by time and keeps hardware ids apart). Only Otava's
algorithm layer is used (``otava.analysis``, numpy and scipy only); the package's CLI,
database and Slack integrations are not needed and are not installed (scripts/setup.sh
installs it with --no-deps: its metadata pins numpy==2.2 for Python < 3.14).

What Otava is given, and what is reported (issue 47):

- **The logarithms of the run medians**, where every one is positive and the metric's changes are
  relative (all but fractions). Run-to-run noise of a timing scales with its level, and a slow
  run is slower by a factor: a planted 4x collective read run medians 23.2, 8.97, 9.4, 8.6, 8.3
  against a flat 2.49, and the t-test on the raw values (the new level's spread dwarfing the old
  one's) gave no change point at the default p-value; on the logarithms the step is p = 2e-10.
  Replayed on synthetic noise it halves the false change points that 10 % of outlier runs make
  and finds more of the steps a scattered new level makes (docs/lifecycle.md has the table).
- **Levels from the segments**: ``before`` and ``after`` are the medians of the run medians from
  the previous change point (or the first run) to this one, and from this one to the next (or
  the last run); the change is after over before. Not the first run after the step (it read
  +833 % where the new level was +260 %), not means (one outlier run moves a mean of five).
- **The magnitude rule on those levels**: Otava keeps a split by its t-test p-value; a change
  whose segment medians differ by ``min_magnitude`` or less is then removed, weakest first, and
  its neighbours are judged again on the merged segments, as Otava's own merge step does.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from perfgate.report.trends import Point, Series

# Chosen on measured false change points (docs/lifecycle.md, tools/changepoint_replay.py): on the
# logarithms, 1e-4 gives none in 200 flat series of 30 runs at 2-30 % Gaussian or lognormal noise
# where Otava's own 1e-3 gives 1-9 (8-23 against 19-44 with one outlier run in ten), and finds all
# 200 4x steps after 5 runs whose new level scatters by 5 % (151 at 30 %; 1e-3: 197).
MAX_PVALUE = 0.0001
MIN_MAGNITUDE = 0.02   # a change smaller than 2 % is below what any perfgate tolerance acts on
WINDOW = 20            # Otava's sliding window in runs (default 50): 30 misses a level that returns within ~8 runs
MIN_RUNS = 4           # fewer clean run medians than this make no series to split


class OtavaMissing(ImportError):
    pass


def _otava():
    try:
        from otava.analysis import TTestSignificanceTester, compute_change_points
    except ImportError:
        raise OtavaMissing("change points need Apache Otava's algorithm layer: "
                           "pip install --no-deps 'apache-otava>=0.8,<0.9' (scripts/setup.sh does)") from None
    return compute_change_points, TTestSignificanceTester


@dataclass(frozen=True)
class ChangePoint:
    series: Series
    at: int            # index into series.points where the new level starts
    p_value: float
    before: float      # median of the run medians of the segment before (from the previous change point)
    after: float       # ... and of the segment after (to the next change point or the last run)
    change: float      # after over before, relative and signed as the value moved (absolute for fractions)
    worse: bool
    runs_before: int = 0  # clean runs in each segment
    runs_after: int = 0

    @property
    def point(self) -> Point:
        return self.series.points[self.at]

    @property
    def shown_change(self) -> str:
        return f"{self.change:+.3f}" if self.series.absolute else f"{self.change:+.1%}"

    def describe(self) -> str:
        s = self.series
        return (f"{s.hardware_id} {s.test_id} {s.metric}: {'worse' if self.worse else 'better'} {self.shown_change} "
                f"({self.before:.4g} -> {self.after:.4g} {s.unit}, medians of {self.runs_before} and {self.runs_after} "
                f"runs, p={self.p_value:.2g}) from run {self.point.created} commit {self.point.commit or '?'}")


def detection_scale(values: list[float], absolute: bool) -> list[float]:
    """What Otava splits: the logarithms of the run medians where every one is positive and the changes
    are relative, else (fractions, a zero or negative median) the medians themselves."""
    if absolute or min(values) <= 0:
        return list(values)
    return [math.log(v) for v in values]


def level_change(before: float, after: float, absolute: bool) -> float:
    """After over before, relative (absolute for fractions); inf from a zero level."""
    if absolute:
        return after - before
    return (after - before) / abs(before) if before else math.inf


def _merged(cuts: list[int], scaled: list[float], values: list[float], absolute: bool, max_pvalue: float,
            min_magnitude: float, tester) -> list[tuple[int, float]]:
    """Otava's merge rule with the magnitude measured on the segments' medians: drop the weakest split
    (p-value at or above ``max_pvalue``, else the smallest change at or below ``min_magnitude``) and judge
    its neighbours again on the merged segments, until every split passes both. -> [(index, p-value)]."""
    cuts = sorted(cuts)
    while cuts:
        bounds = [0, *cuts, len(values)]
        pvalues = [float(tester.compare(scaled[bounds[k]:at], scaled[at:bounds[k + 2]]).pvalue)
                   for k, at in enumerate(cuts)]
        sizes = [abs(level_change(statistics.median(values[bounds[k]:at]), statistics.median(values[at:bounds[k + 2]]),
                                  absolute)) for k, at in enumerate(cuts)]
        weakest = max(range(len(cuts)), key=lambda k: pvalues[k])
        if not pvalues[weakest] < max_pvalue:
            del cuts[weakest]
            continue
        smallest = min(range(len(cuts)), key=lambda k: sizes[k])
        if not sizes[smallest] > min_magnitude:
            del cuts[smallest]
            continue
        return list(zip(cuts, pvalues))
    return []


def find_change_points(series: Series, *, max_pvalue: float = MAX_PVALUE, min_magnitude: float = MIN_MAGNITUDE,
                       window: int = WINDOW, include_tainted: bool = False) -> list[ChangePoint]:
    """Otava's change points of one series' run medians (tainted runs left out unless asked), with the
    levels before and after each from its segments (the module docstring)."""
    if not 0 < max_pvalue < 1 or min_magnitude < 0 or window < 2:
        raise ValueError("max_pvalue must lie in (0, 1), min_magnitude >= 0, window >= 2")
    compute, tester_class = _otava()
    pts = [p for p in series.points if include_tainted or not p.tainted]
    if len(pts) < MIN_RUNS:
        return []
    values = [p.median for p in pts]
    scaled = detection_scale(values, series.absolute)
    found, _ = compute(scaled, window_len=window, max_pvalue=max_pvalue, min_magnitude=0.0)
    kept = _merged([int(c.index) for c in found], scaled, values, series.absolute, max_pvalue, min_magnitude,
                   tester_class(max_pvalue))
    bounds = [0, *(at for at, _ in kept), len(values)]
    out = []
    for k, (at, p_value) in enumerate(kept):
        before, after = statistics.median(values[bounds[k]:at]), statistics.median(values[at:bounds[k + 2]])
        change = level_change(before, after, series.absolute)
        worse = change < 0 if series.better == "higher" else change > 0
        out.append(ChangePoint(series, series.points.index(pts[at]), p_value, float(before), float(after), change,
                               worse, runs_before=at - bounds[k], runs_after=bounds[k + 2] - at))
    return out


def all_change_points(series_list: list[Series], **kw) -> list[ChangePoint]:
    out = []
    for s in series_list:
        out.extend(find_change_points(s, **kw))
    return out


def alarms(found: list[ChangePoint]) -> list[ChangePoint]:
    """The worse change points that are the latest of their series: where the series still sits at the
    worse level. ``--fail-on-worse`` fails on these, so a nightly job turns red when a series drops and
    green again once a later change brings it back (a change point stays in the history for good)."""
    latest: dict[int, ChangePoint] = {}
    for c in found:
        if id(c.series) not in latest or c.at > latest[id(c.series)].at:
            latest[id(c.series)] = c
    return [c for c in latest.values() if c.worse]


@dataclass(frozen=True)
class LeftOut:
    """What a scan did not judge: run medians of tainted runs, runs with nothing else, short series."""

    tainted_points: int = 0
    tainted_runs: int = 0      # runs whose every selected result was tainted
    short_series: int = 0      # series with fewer than MIN_RUNS clean run medians

    def describe(self) -> str:
        parts = []
        if self.tainted_points:
            parts.append(f"{self.tainted_points} tainted run median(s)"
                         + (f" ({self.tainted_runs} run(s) tainted throughout)" if self.tainted_runs else "")
                         + ", --include-tainted counts them")
        if self.short_series:
            parts.append(f"{self.short_series} series with fewer than {MIN_RUNS} runs to compare")
        return "left out: " + "; ".join(parts) if parts else "nothing left out"


def left_out(series_list: list[Series], *, include_tainted: bool = False) -> LeftOut:
    """Count what :func:`find_change_points` leaves out of ``series_list`` (issue 47: "11 runs, 3 series;
    0 change point(s)" when every one of the 11 runs had been left out as tainted)."""
    tainted = short = 0
    by_run: dict[int, list[bool]] = {}
    for s in series_list:
        for p in s.points:
            by_run.setdefault(p.run, []).append(p.tainted)
        kept = [p for p in s.points if include_tainted or not p.tainted]
        tainted += len(s.points) - len(kept)
        short += len(kept) < MIN_RUNS
    runs = 0 if include_tainted else sum(all(flags) for flags in by_run.values())
    return LeftOut(tainted_points=tainted, tainted_runs=runs, short_series=short)
