"""History of runs -> per-metric time series of run medians. Pure: no plotting, no detection.

Input is results JSONs (``pytest --perf-history DIR`` writes one per run; ``--perf-save``
files too, ``.json.gz`` included); series are kept apart per hardware id, because numbers
from two machines are not one series. Where a series changes level is
perfgate.report.changepoints' job (Apache Otava): this module is what Otava does not do,
reading perfgate's own files and ordering them by time.
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


def family_of(test_id: str) -> str:
    """``perf/x/test_a.py::test_b[p-1]`` -> ``test_b``; the module path when there is no function."""
    tail = test_id.split("::")[-1]
    return tail.split("[", 1)[0]


def load_history(*paths: Path) -> list[Run]:
    """Every results JSON in the given folders (``*.json``, ``*.json.gz``) or files, oldest first.
    Unreadable files fail with their name."""
    files: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            files += sorted([*p.glob("*.json"), *p.glob("*.json.gz")])
        elif p.is_file():
            files.append(p)
        else:
            raise FileNotFoundError(f"{p}: no such history folder or results file; write one with "
                                    f"`pytest --perf-history {p}`")
    runs = []
    for path in files:
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
