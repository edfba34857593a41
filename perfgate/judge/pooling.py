"""Several runs of one hardware id -> one baseline: every run's samples, and each run's own summary (:func:`pool`).

Pure functions over results documents (perfgate.store.results.load reads them): the refresh writer
pools to write, the leave-one-out check (perfgate.judge.held_out) pools to judge.
"""
from __future__ import annotations

import json

from perfgate.judge import run_noise
from perfgate.judge.baseline_entry import BaselineEntry
from perfgate.judge.metric_result import metric_results
from perfgate.judge.metrics import summarize


class PoolError(ValueError):
    """Runs that cannot make one baseline (another hardware id, another workload); the message names them."""


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
        raise PoolError(f"cannot pool results of different hardware ids {sorted(ids)} ({', '.join(names)})")
    ref_of = {id(d): ref for d, ref in zip(docs, refs or ())}
    by_key: dict[tuple[str, str], list[tuple[dict, str, dict]]] = {}
    for doc, name in zip(docs, names):
        for r in doc.get("results") or []:
            by_key.setdefault((r["test_id"], r["metric"]), []).append((doc, name, r))
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
            raise PoolError(f"{first['test_id']} {first['metric']}: the runs measured different workloads "
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
