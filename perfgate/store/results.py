"""The results document of one run: every recorded metric with its verdict, as JSON.

This is the hand-over format between a run and everything after it: `--perf-save`
writes it, `perfgate refresh` turns it into baselines, `perfgate compare` diffs two of
them, `perfgate report` plots a history of them.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perfgate.judge import run_noise
from perfgate.store.atomic import write_json_atomic
from perfgate.store.baselines import BaselineEntry, now_iso
from perfgate.judge.metrics import (Metric, Summary, check_declared_tol, check_depends, check_device_busy,
                                    check_floor, dependence_fields)
from perfgate.store.readers import Checker, ReadError, read_json
from perfgate.store.shapes import check_results_document, check_schema

SCHEMA_VERSION = 1
KIND = "perfgate-results"


class ResultsError(ReadError):
    """A results file is unreadable; the message names the file."""


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


def git_commit(cwd: Path | None = None) -> str | None:
    """HEAD, + "-dirty-<hash>" when tracked files differ from it (the hash of `git diff HEAD`, so two
    dirty trees measured from one commit are told apart), or PERFGATE_GIT_COMMIT where the tree was
    copied without .git (GPU runners)."""
    if os.environ.get("PERFGATE_GIT_COMMIT"):
        return os.environ["PERFGATE_GIT_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=cwd, capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                           capture_output=True, text=True, timeout=10).stdout.strip()
    if not dirty:
        return out.stdout.strip()
    diff = subprocess.run(["git", "diff", "HEAD", "--binary"], cwd=cwd, capture_output=True, timeout=30).stdout
    return f"{out.stdout.strip()}-dirty-{hashlib.sha256(diff).hexdigest()[:10]}"


def make_document(results: list[MetricResult], *, hardware_id: str, fingerprint: dict, commit: str | None,
                  attachments: dict[str, dict[str, Any]] | None = None, interrupted: bool = False,
                  skipped_by_budget: list[str] | None = None) -> dict:
    return {"schema_version": SCHEMA_VERSION, "kind": KIND, "created": now_iso(), "hardware_id": hardware_id,
            "commit": commit, "fingerprint": fingerprint, "interrupted": interrupted,
            "skipped_by_budget": skipped_by_budget or [],
            "results": [r.to_dict() for r in results], "attachments": attachments or {}}


def save(path: Path, document: dict) -> None:
    write_json_atomic(Path(path), document)


def load(path: Path) -> dict:
    """A results file, checked down to every entry a command reads (perfgate.store.readers)."""
    path = Path(path)
    fix = "results files are written by `pytest --perf-save PATH`: re-run with --perf-save"
    try:
        doc = read_json(path, fix="re-run with --perf-save", error=ResultsError)
    except FileNotFoundError:
        raise ResultsError(f"{path}: no such results file; write one with `pytest --perf-save {path}`") from None
    if not isinstance(doc, dict) or doc.get("kind") != KIND:
        raise ResultsError(f"{path}: not a perfgate results file (kind != {KIND!r}); "
                           f"results files are written by `pytest --perf-save PATH`")
    check_schema(path, doc.get("schema_version"), (SCHEMA_VERSION,), what="results ",
                 fix="re-run the suite with this perfgate", error=ResultsError)
    check_results_document(Checker(path, fix=fix, error=ResultsError), doc)
    return doc


def metric_results(doc: dict) -> list[MetricResult]:
    return [MetricResult.from_dict(r) for r in doc.get("results") or []]


def _runs_of(doc: dict, raw: dict) -> list[dict]:
    """The per-run summaries of one result: pooled ones carry them, a single run is its own."""
    if raw.get("runs"):
        return list(raw["runs"])
    return [run_noise.run_summary_of(raw["summary"], absolute=raw["unit"] == "fraction", when=doc.get("created"),
                                     commit=doc.get("commit"), fingerprint=doc.get("fingerprint")).to_dict()]


def baseline_entries(doc: dict, *, include_tainted: bool = False) -> dict[str, dict[str, dict[str, BaselineEntry]]]:
    """Results -> {area: {test_id: {metric: BaselineEntry}}}, provenance ``measured``, with each run's summary."""
    software = (doc.get("fingerprint") or {}).get("software")
    out: dict[str, dict[str, dict[str, BaselineEntry]]] = {}
    for raw, r in zip(doc.get("results", []), metric_results(doc)):
        if r.tainted and not include_tainted:
            continue
        runs = _runs_of(doc, raw)
        provenance = "measured" if len(runs) < 2 else \
            f"measured, pooled over {len(runs)} runs (" + ", ".join(
                f"{x.get('when')} commit {x.get('commit')}" for x in runs) + ")"
        entry = BaselineEntry(unit=r.unit, better=r.better, summary=r.summary, tol=r.tol, provenance=provenance,
                              when=doc.get("created"), commit=doc.get("commit"), software=software,
                              runs=tuple(runs), workload=r.workload, depends=r.depends, device_busy=r.device_busy)
        out.setdefault(r.area, {}).setdefault(r.test_id, {})[r.metric] = entry
    return out


def newest(docs: list[dict]) -> dict:
    """The most recently created of ``docs``: its fingerprint is the one a pool of them keeps."""
    return max(docs, key=lambda d: d.get("created") or "")


def pool(docs: list[dict], names: list[str], *, include_tainted: bool = False,
         refs: list[dict] | None = None) -> dict:
    """Several runs on one hardware id -> one document whose metrics hold all runs' samples.

    Why: run-to-run (or machine-instance-to-instance) variation is larger than the spread
    inside one run; a baseline pooled over runs carries that variation in its samples, and
    each metric keeps one summary per run it pooled (``runs``) for the between-run noise
    model. A run that marked a metric tainted contributes nothing to it (unless
    ``include_tainted``, or every run tainted it: then it stays tainted and refresh skips it).
    ``refs``: each document's results-store reference (run_store.run_reference), which its run
    summaries record in place of its name, so that a baseline names no machine's paths."""
    if len(docs) == 1:
        return _with_reference(docs[0], refs[0]) if refs else docs[0]
    ids = {d["hardware_id"] for d in docs}
    if len(ids) > 1:
        raise ResultsError(f"cannot pool results of different hardware ids {sorted(ids)} ({', '.join(names)})")
    ref_of = {id(d): ref for d, ref in zip(docs, refs or ())}
    by_key: dict[tuple[str, str], list[tuple[dict, str, dict]]] = {}
    for doc, name in zip(docs, names):
        for r in doc.get("results") or []:
            by_key.setdefault((r["test_id"], r["metric"]), []).append((doc, name, r))
    from perfgate.judge.metrics import summarize

    results = []
    for contributions in by_key.values():
        clean = [c for c in contributions if not c[2].get("tainted")]
        use = contributions if include_tainted or not clean else clean
        first = use[0][2]
        # A run of another model or engine flags is another baseline, never pooled into this one. A run
        # from before identities were recorded (no "workload") pools with any: its workload is not
        # known, refusing it would strand every older run, and the pooled entry keeps the one recorded.
        workloads = {json.dumps(r["workload"], sort_keys=True): name for _, name, r in use if r.get("workload")}
        if len(workloads) > 1:
            raise ResultsError(f"{first['test_id']} {first['metric']}: the runs measured different workloads "
                               f"({'; '.join(f'{n}: {w}' for w, n in workloads.items())}); pool runs of one "
                               f"workload (a baseline of another model or engine flags is another baseline)")
        workload = next((r["workload"] for _, _, r in use if r.get("workload")), None)
        samples = [x for _, _, r in use for x in r["summary"]["samples"]]
        runs = []
        for doc, name, r in use:
            runs.append(run_noise.run_summary_of(r["summary"], absolute=r["unit"] == "fraction",
                                                 when=doc.get("created"), commit=doc.get("commit"),
                                                 fingerprint=doc.get("fingerprint"),
                                                 file=name).to_dict() | ref_of.get(id(doc), {}))
        busy = [r.get("device_busy") for _, _, r in use]  # device-bound only if every pooled run was
        # the runs' stored samples (each run's quantiles: runs weigh alike), n counting every sample taken
        taken = sum(int(r["summary"].get("n", len(r["summary"]["samples"]))) for _, _, r in use)
        summary = summarize(samples).to_dict() | {"n": max(taken, len(samples))}
        results.append(dict(first, summary=summary, runs=runs, workload=workload,
                            device_busy=None if None in busy else min(busy),
                            tainted=[t for _, _, r in use for t in (r.get("tainted") or [])],
                            left_out=[c[1] for c in contributions if all(c[2] is not u[2] for u in use)]))
    out = dict(newest(docs), results=results)
    out["pooled_from"] = [{"file": n, "created": d.get("created"), "commit": d.get("commit")} for n, d in zip(names, docs)]
    return out


def _with_reference(doc: dict, ref: dict) -> dict:
    """One run's document whose metrics each carry their run summary, naming the stored results file
    (a metric that already holds several runs' summaries, from a pooled document, keeps its own)."""
    return dict(doc, results=[r if r.get("runs") else dict(r, runs=[_runs_of(doc, r)[0] | ref])
                              for r in doc.get("results") or []])
