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
"""
from __future__ import annotations

from dataclasses import dataclass

from perfgate.report.trends import Point, Series

MAX_PVALUE = 0.0001    # 10x stricter than Otava's default: see docs/lifecycle.md (fewer false, no fewer found)
MIN_MAGNITUDE = 0.02   # a change smaller than 2 % is below what any perfgate tolerance acts on
WINDOW = 20            # Otava's sliding window in runs (default 50): 30 misses a level that returns within ~8 runs


class OtavaMissing(ImportError):
    pass


def _otava():
    try:
        from otava.analysis import compute_change_points
    except ImportError:
        raise OtavaMissing("change points need Apache Otava's algorithm layer: "
                           "pip install --no-deps 'apache-otava>=0.8,<0.9' (scripts/setup.sh does)") from None
    return compute_change_points


@dataclass(frozen=True)
class ChangePoint:
    series: Series
    at: int            # index into series.points where the new level starts
    p_value: float
    before: float      # mean of the run medians of the segment before
    after: float       # ... and after
    change: float      # relative, signed as the value moved (absolute for fractions)
    worse: bool

    @property
    def point(self) -> Point:
        return self.series.points[self.at]

    @property
    def shown_change(self) -> str:
        return f"{self.change:+.3f}" if self.series.absolute else f"{self.change:+.1%}"

    def describe(self) -> str:
        s = self.series
        return (f"{s.hardware_id} {s.test_id} {s.metric}: {'worse' if self.worse else 'better'} {self.shown_change} "
                f"({self.before:.4g} -> {self.after:.4g} {s.unit}, p={self.p_value:.2g}) from run "
                f"{self.point.created} commit {self.point.commit or '?'}")


def find_change_points(series: Series, *, max_pvalue: float = MAX_PVALUE, min_magnitude: float = MIN_MAGNITUDE,
                       window: int = WINDOW, include_tainted: bool = False) -> list[ChangePoint]:
    """Otava's change points of one series' run medians (tainted runs left out unless asked)."""
    if not 0 < max_pvalue < 1 or min_magnitude < 0 or window < 2:
        raise ValueError("max_pvalue must lie in (0, 1), min_magnitude >= 0, window >= 2")
    compute = _otava()
    pts = [p for p in series.points if include_tainted or not p.tainted]
    if len(pts) < 4:
        return []
    values = [p.median for p in pts]
    found, _ = compute(values, window_len=window, max_pvalue=max_pvalue, min_magnitude=min_magnitude)
    out = []
    for cp in found:
        before, after = float(cp.stats.mean_before()), float(cp.stats.mean_after())
        if series.absolute:
            change = after - before
        else:
            change = (after - before) / abs(before) if before else float("inf")
        worse = change < 0 if series.better == "higher" else change > 0
        out.append(ChangePoint(series, series.points.index(pts[cp.index]), float(cp.stats.pvalue), before, after,
                               change, worse))
    return out


def all_change_points(series_list: list[Series], **kw) -> list[ChangePoint]:
    out = []
    for s in series_list:
        out.extend(find_change_points(s, **kw))
    return out
