"""BaselineEntry: the reference one metric of one test is judged against on one hardware id.

The judge's type (perfgate.judge.gate judges against it); the files that keep entries are the
store's (perfgate.store.baselines reads and writes them).
"""
from __future__ import annotations

from dataclasses import dataclass

from perfgate.judge.metrics import Summary, check_depends, check_device_busy, dependence_fields


@dataclass(frozen=True)
class BaselineEntry:
    """The reference for one metric of one test on one hardware id."""

    unit: str
    better: str
    summary: Summary
    tol: float | None
    provenance: str  # "measured" or "imported: <source>"
    when: str | None = None
    commit: str | None = None
    software: dict | None = None
    source: str | None = None  # for imported numbers: the section of the report
    spread: dict | None = None  # from `perfgate calibrate`: run-to-run spread and the tolerance it proposed
    runs: tuple[dict, ...] = ()  # one run_noise.RunSummary dict per contributing run (schema 2)
    workload: dict | None = None  # what was measured beyond the test id (PerfRecorder.identify)
    depends: str | None = None  # as recorded (perf.record depends=); None: the unit's default
    device_busy: float | None = None  # share of the timed region the device was busy, as recorded
    # the key in the file's ``fingerprints`` table of the machine this entry was measured on; None: the
    # file's own ``fingerprint`` (see BaselineStore.write: set only where a later merge brought another)
    fingerprint_key: str | None = None

    def to_dict(self) -> dict:
        d = {"unit": self.unit, "better": self.better, "tol": self.tol, "summary": self.summary.to_dict(),
             "provenance": self.provenance, "when": self.when, "commit": self.commit, "software": self.software}
        if self.source:
            d["source"] = self.source
        if self.spread:
            d["spread"] = self.spread
        if self.runs:
            d["runs"] = [dict(r) for r in self.runs]
        if self.workload:
            d["workload"] = dict(self.workload)
        d.update(dependence_fields(self))
        if self.fingerprint_key:
            d["fingerprint_key"] = self.fingerprint_key
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "BaselineEntry":
        return cls(unit=d["unit"], better=d["better"], summary=Summary.from_dict(d["summary"]), tol=d.get("tol"),
                   provenance=d.get("provenance", "measured"), when=d.get("when"), commit=d.get("commit"),
                   software=d.get("software"), source=d.get("source"), spread=d.get("spread"),
                   runs=tuple(d.get("runs") or ()), workload=d.get("workload") or None,
                   depends=check_depends(d.get("depends"), "depends"),
                   device_busy=check_device_busy(d.get("device_busy"), "device_busy"),
                   fingerprint_key=d.get("fingerprint_key") or None)

    @property
    def is_imported(self) -> bool:
        return self.provenance.startswith("imported")
