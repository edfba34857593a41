"""History of runs -> per-metric time series -> sustained step changes. Pure: no plotting.

A nightly run that is 8 % slower once is noise; three nightly runs in a row that are
all 8 % slower than the weeks before is a step change that a single-run gate with a
10 % tolerance never flags. This module finds those: a change of the median level,
beyond the metric's tolerance, sustained over ``min_run`` consecutive runs.

Input is a folder of results JSONs (``pytest --perf-history DIR`` writes one per run);
series are kept apart per hardware id, because numbers from two machines are not one
series.
"""
from __future__ import annotations

import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from perfgate.store import results as results_mod


@dataclass(frozen=True)
class Run:
    path: Path
    created: str
    commit: str | None
    hardware_id: str
    interrupted: bool
    results: tuple[results_mod.MetricResult, ...]

    @property
    def label(self) -> str:
        return f"{self.created[:16].replace('T', ' ')} {(self.commit or '?')[:8]}"


@dataclass(frozen=True)
class Point:
    run: int             # index into the history (time order)
    created: str
    commit: str | None
    median: float
    q1: float            # from the IQR around the median, for error bars
    q3: float
    n: int
    tainted: bool
    outcome: str


@dataclass
class Series:
    hardware_id: str
    test_id: str
    metric: str
    unit: str
    better: str
    tol: float
    points: list[Point] = field(default_factory=list)
    baseline_median: float | None = None   # the last run's baseline, if it had one
    baseline_provenance: str | None = None

    @property
    def absolute(self) -> bool:
        """Fractions use absolute tolerances (0.30 -> 0.33 is 0.03), everything else relative."""
        return self.unit == "fraction"

    @property
    def family(self) -> str:
        """What one plot shows: one test function and one metric, e.g. ``test_all_reduce busbw_gbps``."""
        return f"{family_of(self.test_id)} {self.metric}"


@dataclass(frozen=True)
class StepChange:
    series: Series
    at: int                # index into series.points where the new level starts
    before: float          # median level of the reference window
    after: float           # median level of the sustained run
    change: float          # relative (or absolute for fractions), signed as the value moved
    worse: bool
    length: int            # how many consecutive runs sustain it

    @property
    def point(self) -> Point:
        return self.series.points[self.at]

    def describe(self) -> str:
        unit = "" if self.series.absolute else "%"
        shown = f"{self.change * (1 if self.series.absolute else 100):+.{3 if self.series.absolute else 1}f}{unit}"
        return (f"{self.series.test_id} {self.series.metric}: {'worse' if self.worse else 'better'} step "
                f"{shown} ({_fmt(self.before)} -> {_fmt(self.after)} {self.series.unit}) from run "
                f"{self.point.created} commit {self.point.commit or '?'}, sustained {self.length} runs")


def _fmt(x: float) -> str:
    return f"{x:.4g}"


def family_of(test_id: str) -> str:
    """``perf/x/test_a.py::test_b[p-1]`` -> ``test_b``; the module path when there is no function."""
    tail = test_id.split("::")[-1]
    return tail.split("[", 1)[0]


def load_history(folder: Path) -> list[Run]:
    """Every results JSON in ``folder``, oldest first. Unreadable files fail with their name."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: no such history folder; write one with `pytest --perf-history {folder}`")
    runs = []
    for path in sorted([*folder.glob("*.json"), *folder.glob("*.json.gz")]):
        doc = results_mod.load(path)
        runs.append(Run(path=path, created=doc.get("created") or "", commit=doc.get("commit"),
                        hardware_id=doc.get("hardware_id") or "?", interrupted=bool(doc.get("interrupted")),
                        results=tuple(results_mod.metric_results(doc))))
    runs.sort(key=lambda r: (r.created, r.path.name))
    return runs


def build_series(runs: list[Run], *, hardware_id: str | None = None) -> list[Series]:
    """One series per (hardware id, test, metric), points in run order. Interrupted runs are kept:
    what they measured is real, only their coverage is partial."""
    out: dict[tuple[str, str, str], Series] = {}
    for i, run in enumerate(runs):
        if hardware_id is not None and run.hardware_id != hardware_id:
            continue
        for r in run.results:
            key = (run.hardware_id, r.test_id, r.metric)
            s = out.get(key)
            if s is None:
                s = out[key] = Series(run.hardware_id, r.test_id, r.metric, r.unit, r.better, r.tol)
            s.tol = r.tol  # the latest tolerance applies
            q1, q3 = quartiles(r.summary)
            s.points.append(Point(run=i, created=run.created, commit=run.commit, median=r.summary.median,
                                  q1=q1, q3=q3, n=r.summary.n, tainted=bool(r.tainted), outcome=r.outcome))
            if r.baseline and r.baseline.get("median") is not None:
                s.baseline_median = float(r.baseline["median"])
                s.baseline_provenance = r.baseline.get("provenance")
    return sorted(out.values(), key=lambda s: (s.hardware_id, s.family, natural_key(s.test_id)))


_SIZE = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "KB": 10**3, "MB": 10**6, "GB": 10**9}


def natural_key(test_id: str) -> tuple:
    """Order ids as a reader expects: ``1KiB < 16KiB < 1MiB``, ``C=2 < C=16``, ``pp2 < pp8``."""
    parts = re.split(r"(\d+(?:\.\d+)?)(?:(KiB|MiB|GiB|KB|MB|GB|B)(?![A-Za-z]))?", test_id)
    key: list = []
    for i in range(0, len(parts), 3):
        key.append((0, parts[i] or ""))
        if i + 1 < len(parts) and parts[i + 1] is not None:
            key.append((1, float(parts[i + 1]) * _SIZE.get(parts[i + 2] or "B", 1)))
    return tuple(key)


def quartiles(summary) -> tuple[float, float]:
    """Quartiles from the stored samples; from the IQR around the median when too few are stored."""
    if len(summary.samples) >= 4:
        q1, q3 = statistics.quantiles(summary.samples, n=4, method="inclusive")[0::2]
        return min(q1, summary.median), max(q3, summary.median)
    return summary.median - summary.iqr / 2, summary.median + summary.iqr / 2


def _change(before: float, after: float, absolute: bool) -> float:
    if absolute:
        return after - before
    if before == 0:
        return 0.0 if after == 0 else float("inf")
    return (after - before) / abs(before)


def _noise(ref_medians: list[float], level: float, absolute: bool) -> float:
    """Run-to-run spread of the reference window: 1.4826 x MAD, relative to the level unless absolute."""
    mad = statistics.median(abs(m - level) for m in ref_medians) * 1.4826
    if absolute:
        return mad
    return mad / abs(level) if level else 0.0


def find_steps(series: Series, *, min_run: int = 3, window: int = 5, min_reference: int = 3,
               include_tainted: bool = False, noise_k: float = 3.0) -> list[StepChange]:
    """Sustained level changes in one series.

    Walk the points; the reference level is the median of up to ``window`` points before
    the candidate (at least ``min_reference``). A step starts at point i when points
    i .. i+min_run-1 all differ from the reference, in the same direction, by more than
    the tolerance *and* by more than ``noise_k`` times the reference window's own
    run-to-run spread (a machine whose runs scatter by 30 % cannot show a 10 % step;
    ``noise_k=0`` checks the tolerance only). After a step the reference restarts at the
    new level, so a second step is measured from the first. Tainted points are skipped
    unless asked for.
    """
    if min_run < 1 or window < 1 or min_reference < 1:
        raise ValueError("min_run, window and min_reference must be >= 1")
    if noise_k < 0:
        raise ValueError("noise_k must be >= 0")
    pts = [p for p in series.points if include_tainted or not p.tainted]
    steps: list[StepChange] = []
    start = 0  # first index of the current level
    i = start + min_reference
    while i + min_run <= len(pts):
        ref_pts = pts[max(start, i - window):i]
        if len(ref_pts) < min_reference:
            i += 1
            continue
        ref = statistics.median(p.median for p in ref_pts)
        limit = max(series.tol, noise_k * _noise([p.median for p in ref_pts], ref, series.absolute))
        changes = [_change(ref, p.median, series.absolute) for p in pts[i:i + min_run]]
        up = all(c > limit for c in changes)
        down = all(c < -limit for c in changes)
        if up or down:
            # extend the run while it stays beyond the limit in the same direction
            end = i + min_run
            while end < len(pts):
                c = _change(ref, pts[end].median, series.absolute)
                if (up and c > limit) or (down and c < -limit):
                    end += 1
                else:
                    break
            after = statistics.median(p.median for p in pts[i:end])
            change = _change(ref, after, series.absolute)
            worse = (change < 0) if series.better == "higher" else (change > 0)
            at = series.points.index(pts[i])
            steps.append(StepChange(series, at, ref, after, change, worse, end - i))
            start = i
            i = start + min_reference
            continue
        i += 1
    return steps


def all_steps(series_list: list[Series], **kw) -> list[StepChange]:
    out = []
    for s in series_list:
        out.extend(find_steps(s, **kw))
    return out
