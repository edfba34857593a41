"""History of runs -> per-metric time series of run medians. Pure: no plotting, no detection.

Input is results files (``--perf-save``, ``.json.gz`` included) or a results store (a history folder
that ``pytest --perf-history DIR`` writes is one; perfgate.store.backends: its metric rows,
one indexed read, no document loaded until a page shows a run's verdicts); series are kept apart
per hardware id, because numbers from two machines are not one series. Both become the same metric
rows (perfgate.store.backends.documents.metric_rows), so a series is built one way. Where a series
changes level is perfgate.report.changepoints' job (Apache Otava): this module is what Otava does
not do, reading perfgate's own runs and ordering them by time.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Callable

from perfgate.store import results as results_mod
from perfgate.judge.metric_result import MetricResult
from perfgate.judge.metric_result import metric_results
from perfgate.store.backends import ResultsStore, documents
from perfgate.store.backends.folder import FolderStore


@dataclass(frozen=True)
class Run:
    path: Path           # the results file, or the run's name in its store
    created: str
    commit: str | None
    hardware_id: str
    interrupted: bool
    rows: tuple[documents.MetricRow, ...]    # what series are built from
    load: Callable[[], dict] = field(repr=False, compare=False)   # the whole document, read when shown

    @cached_property
    def results(self) -> tuple[MetricResult, ...]:
        """Every result with its verdict: read from the file or store when a page shows this run."""
        return tuple(metric_results(self.load()))

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

    def band(self, base: float) -> tuple[float, float]:
        """The baseline's tolerance band as a plot draws it: ``base`` +- tol (absolute for fractions,
        relative otherwise). A relative band of a series that never goes below zero stops at zero: a
        ratio with tol 1.5 around 1.07 was drawn down to -0.54, where no run of it can be."""
        if self.absolute:
            return base - self.tol, base + self.tol
        lo, hi = base * (1 - self.tol), base * (1 + self.tol)
        if base >= 0 and all(p.q1 >= 0 for p in self.points):
            lo = max(lo, 0.0)
        return lo, hi

    @property
    def family(self) -> str:
        """What one plot shows: one test function and one metric, e.g. ``test_all_reduce busbw_gbps``."""
        return f"{family_of(self.test_id)} {self.metric}"


def family_of(test_id: str) -> str:
    """``perf/x/test_a.py::test_b[p-1]`` -> ``test_b``; the module path when there is no function."""
    tail = test_id.split("::")[-1]
    return tail.split("[", 1)[0]


def load_history(*paths: Path) -> list[Run]:
    """Every run in the given history folders (read as the results store they are: ``pytest --perf-history
    DIR`` lays runs out as ``DIR/<hardware-id>/<name>.json.gz``; an older one holds ``DIR/*.json``) and
    results files, oldest first. Unreadable files fail with their name."""
    runs = []
    for p in map(Path, paths):
        if p.is_dir():
            runs += history_from_store(FolderStore(p, create=False))
        elif p.is_file():
            doc = results_mod.load(p)
            entry = documents.entry_of(doc, "", f"{doc['hardware_id']}/{p.name}")
            runs.append(Run(path=p, created=entry.created, commit=entry.commit, hardware_id=entry.hardware_id,
                            interrupted=entry.interrupted, rows=tuple(documents.metric_rows(doc, entry)),
                            load=lambda doc=doc: doc))
        else:
            raise FileNotFoundError(f"{p}: no such history folder or results file; write one with "
                                    f"`pytest --perf-history {p}`")
    runs.sort(key=lambda r: (r.created, r.path.name))
    return runs


def history_from_store(store: ResultsStore, *, hardware_id: str | None = None) -> list[Run]:
    """Every run of a results store (of one hardware id), oldest first, from its metric rows: a document is
    read only when a page shows that run's verdicts."""
    rows: dict[str, list[documents.MetricRow]] = {}
    for row in store.metric_rows(hardware_id):
        rows.setdefault(row.sha256, []).append(row)
    return [Run(path=Path(e.name), created=e.created, commit=e.commit, hardware_id=e.hardware_id,
                interrupted=e.interrupted, rows=tuple(rows.get(e.sha256, ())),
                load=lambda sha=e.sha256: store.document(sha)) for e in store.entries(hardware_id)]


def build_series(runs: list[Run], *, hardware_id: str | None = None) -> list[Series]:
    """One series per (hardware id, test, metric), points in run order. Interrupted runs are kept:
    what they measured is real, only their coverage is partial."""
    out: dict[tuple[str, str, str], Series] = {}
    for i, run in enumerate(runs):
        if hardware_id is not None and run.hardware_id != hardware_id:
            continue
        for r in run.rows:
            key = (run.hardware_id, r.test_id, r.metric)
            s = out.get(key)
            if s is None:
                s = out[key] = Series(run.hardware_id, r.test_id, r.metric, r.unit, r.better, r.tol)
            s.tol = r.tol  # the latest tolerance applies
            s.points.append(Point(run=i, created=run.created, commit=run.commit, median=r.median,
                                  q1=r.q1, q3=r.q3, n=r.n, tainted=r.tainted, outcome=r.outcome))
            if r.baseline_median is not None:
                s.baseline_median = r.baseline_median
                s.baseline_provenance = r.baseline_provenance
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


quartiles = documents.quartiles  # where a summary's error bar comes from (one rule for files and stores)
