"""MetricResult: the judge's output, one verdict on one metric of one test, and how a test id is read.

The type belongs to its owner, the judge (perfgate.judge.gate makes it); the results file that
carries it between a run and every command after it is the store's (perfgate.store.results).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from perfgate.judge.metrics import (Metric, Summary, check_declared_tol, check_depends, check_device_busy,
                                    check_floor, dependence_fields)


@dataclass
class MetricResult:
    test_id: str
    area: str
    metric: str
    unit: str
    better: str
    tol: float
    gated: bool
    summary: Summary
    verdict: dict
    baseline: dict | None = None  # summary + provenance of the baseline compared against
    attempts: int = 1
    rerun: str = ""
    tainted: list[str] = field(default_factory=list)
    workload: dict[str, str] | None = None  # what was measured beyond the test id (PerfRecorder.identify)
    depends: str | None = None  # as recorded (perf.record depends=); None: the unit's default
    device_busy: float | None = None  # share of the timed region the device was busy, as recorded
    declared_tol: float | None = None  # the test's own tol= (perf.record), before overrides and run noise
    floor: float | None = None  # the test's own floor= (perf.record): the smallest change it resolves

    def to_dict(self) -> dict:
        d = {"test_id": self.test_id, "area": self.area, "metric": self.metric, "unit": self.unit,
             "better": self.better, "tol": self.tol, "gated": self.gated, "summary": self.summary.to_dict(),
             "verdict": self.verdict, "baseline": self.baseline, "attempts": self.attempts,
             "rerun": self.rerun, "tainted": self.tainted}
        if self.workload:
            d["workload"] = dict(self.workload)
        d.update(dependence_fields(self))
        if self.declared_tol is not None:
            d["declared_tol"] = self.declared_tol
        if self.floor is not None:
            d["floor"] = self.floor
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "MetricResult":
        where = f"result {d.get('test_id')!r} {d.get('metric')!r}"
        return cls(test_id=d["test_id"], area=d["area"], metric=d["metric"], unit=d["unit"], better=d["better"],
                   tol=d["tol"], gated=d.get("gated", True), summary=Summary.from_dict(d["summary"]),
                   verdict=d.get("verdict") or {}, baseline=d.get("baseline"), attempts=d.get("attempts", 1),
                   rerun=d.get("rerun", ""), tainted=d.get("tainted") or [], workload=d.get("workload") or None,
                   depends=check_depends(d.get("depends"), where),
                   device_busy=check_device_busy(d.get("device_busy"), where),
                   declared_tol=check_declared_tol(d.get("declared_tol"), where),
                   floor=check_floor(d.get("floor"), where))

    @property
    def outcome(self) -> str:
        return self.verdict.get("outcome", "new")

    def measured(self) -> Metric:
        """The metric as its test recorded it, for gate.evaluate to judge again: name, unit, direction,
        samples, the test's own tolerance, what it depends on and the device's busy share. ``tol`` (the
        tolerance it was judged at, after overrides and the run-noise model) is not the test's: files
        written before ``declared_tol`` existed re-judge at the configured tolerances."""
        return Metric(name=self.metric, unit=self.unit, better=self.better, summary=self.summary,
                      tol=self.declared_tol, depends=self.depends, device_busy=self.device_busy, floor=self.floor)


def area_of(test_id: str) -> str:
    """``perf/collectives/test_x.py::...`` -> ``collectives``; other paths -> their folder name."""
    path = test_id.split("::", 1)[0]
    parts = Path(path).parts
    if "perf" in parts and parts.index("perf") + 2 <= len(parts) - 1:
        return parts[parts.index("perf") + 1]
    return parts[-2] if len(parts) >= 2 else "misc"


def metric_results(doc: dict) -> list[MetricResult]:
    """Every metric of a results document (perfgate.store.results.load), as the judge reads it."""
    return [MetricResult.from_dict(r) for r in doc.get("results") or []]


def short_id(test_id: str) -> str:
    """``perf/collectives/test_x.py::test_all_reduce[gloo-2-4MiB]`` -> ``test_all_reduce[gloo-2-4MiB]``:
    how a test id reads in a table or a one-line message."""
    return test_id.split("::", 1)[-1]
