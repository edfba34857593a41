"""Turn one recorded metric and its baseline entry into a MetricResult with a verdict.

The one place that decides *whether* a metric is gated (ratios everywhere, absolute
numbers on GPU hardware ids, as `gate` says; never what a machine's ``record_only`` table
names, unless gate is "all") and *which* tolerance applies. Used by the
plugin during a run and by `perfgate compare` on saved results, so both agree.
"""
from __future__ import annotations

from perfgate import run_noise
from perfgate.baselines import BaselineEntry
from perfgate.config import ABS_FLOORS, Settings
from perfgate.metrics import RATIO_FAMILIES, UNIT_FAMILIES, Metric, summarize
from perfgate.results import MetricResult, area_of
from perfgate.run_noise import RunSummary
from perfgate.verdict import MIN_SAMPLES_FOR_RANK_TEST, decide


def is_gated(unit: str, hardware_id: str, gate: str) -> bool:
    if gate == "all":
        return True
    ratio = UNIT_FAMILIES[unit] in RATIO_FAMILIES
    if gate == "ratios":
        return ratio
    return ratio or not hardware_id.startswith("cpu-")


def tolerance(settings: Settings, test_id: str, metric: Metric, entry: BaselineEntry | None = None) -> float:
    """Precedence: a config override, then a tolerance calibrated on this machine (stored with the
    baseline by `perfgate calibrate --write`), then the test's own ``tol``, then the family default."""
    override = settings.override_for(test_id, metric.name)
    if override is not None:
        return override
    if entry is not None and entry.spread and entry.tol is not None:
        return float(entry.tol)
    if metric.tol is not None:
        return float(metric.tol)
    return settings.tolerances[metric.family]


def baseline_view(entry: BaselineEntry) -> dict:
    return {"median": entry.summary.median, "mad": entry.summary.mad, "n": entry.summary.n,
            "samples": list(entry.summary.samples), "provenance": entry.provenance, "when": entry.when,
            "commit": entry.commit, "software": entry.software, "source": entry.source,
            "run_medians": [r["median"] for r in entry.runs]}


def evaluate(test_id: str, metric: Metric, entry: BaselineEntry | None, *, settings: Settings,
             hardware_id: str, samples: list[float] | None = None, attempts: int = 1,
             tainted: list[str] | None = None) -> MetricResult:
    """Verdict for ``metric`` (or for ``samples`` pooled over re-measurements) against ``entry``."""
    values = samples if samples is not None else list(metric.summary.samples)
    summary = summarize(values)
    tol = tolerance(settings, test_id, metric, entry)
    absolute = metric.family == "fraction"
    if entry is None:
        verdict = decide(None, values, better=metric.better, tol=tol, absolute_tol=absolute)
    else:
        if entry.unit != metric.unit or entry.better != metric.better:
            raise ValueError(f"{test_id} {metric.name}: baseline is {entry.unit}/{entry.better}-is-better, "
                             f"the test now records {metric.unit}/{metric.better}; refresh the baseline")
        few = entry.summary.n < MIN_SAMPLES_FOR_RANK_TEST or len(entry.summary.samples) < MIN_SAMPLES_FOR_RANK_TEST
        base_median = entry.summary.median if few else None
        runs = [RunSummary.from_dict(r) for r in entry.runs]
        if len(runs) >= run_noise.MIN_RUNS:  # between-run model: vs the run medians, tolerance >= k x their spread
            tol = run_noise.effective_tolerance(tol, runs, absolute=absolute)
            base_median = run_noise.center(runs)
        verdict = decide(list(entry.summary.samples), values, better=metric.better, tol=tol, absolute_tol=absolute,
                         abs_floor=ABS_FLOORS.get(metric.unit, 0.0), baseline_median=base_median)
    gated = (is_gated(metric.unit, hardware_id, settings.gate) and not tainted
             and (settings.gate == "all" or settings.record_only_reason(test_id, metric.name) is None))
    return MetricResult(test_id=test_id, area=area_of(test_id), metric=metric.name, unit=metric.unit,
                        better=metric.better, tol=tol, gated=gated, summary=summary, verdict=verdict.to_dict(),
                        baseline=baseline_view(entry) if entry else None, attempts=attempts,
                        rerun=f"pytest '{test_id}'", tainted=list(tainted or []))
