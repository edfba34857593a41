"""Turn one recorded metric and its baseline entry into a MetricResult with a verdict.

The one place that decides *whether* a metric is gated (ratios everywhere, absolute
numbers on GPU hardware ids, as `gate` says; never what a machine's ``record_only`` table
names, unless gate is "all") and *which* tolerance applies. Used by the
plugin during a run and by `perfgate compare` on saved results, so both agree.
"""
from __future__ import annotations

from dataclasses import replace

from perfgate.judge import guard, run_noise
from perfgate.store.baselines import BaselineEntry
from perfgate.judge.config import ABS_FLOORS, ConfigError, Settings
from perfgate.judge.fingerprint_check import FingerprintDiff, not_comparable, other_workload
from perfgate.judge.metrics import RATIO_FAMILIES, UNIT_FAMILIES, Metric, summarize
from perfgate.store.results import MetricResult, area_of
from perfgate.judge.run_noise import RunSummary
from perfgate.judge.verdict import MIN_SAMPLES_FOR_RANK_TEST, Outcome, decide, is_exact


def is_gated(unit: str, hardware_id: str, gate: str) -> bool:
    if gate == "all":
        return True
    # counts (all-reduce calls per step) are machine-independent like in-run ratios
    ratio = UNIT_FAMILIES[unit] in RATIO_FAMILIES or UNIT_FAMILIES[unit] == "count"
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


def check_fraction_range(test_id: str, metric: str, better: str, baseline: float, tol: float) -> None:
    """A fraction lives in [0, 1]: a tolerance that lets it worsen past that edge can never fail."""
    room = (1.0 - baseline) if better == "lower" else baseline
    if tol >= room:
        raise ConfigError(f"{test_id} {metric}: tolerance {tol:g} is wider than the fraction's room to worsen "
                          f"from its baseline {baseline:.3g} ({room:.3g}), so it can never fail; lower it in "
                          f"baselines/<hardware-id>/tolerances.toml or the test's tol")


def baseline_view(entry: BaselineEntry) -> dict:
    return {"median": entry.summary.median, "mad": entry.summary.mad, "n": entry.summary.n,
            "samples": list(entry.summary.samples), "provenance": entry.provenance, "when": entry.when,
            "commit": entry.commit, "software": entry.software, "source": entry.source,
            "run_medians": [r["median"] for r in entry.runs], "workload": entry.workload}


def evaluate(test_id: str, metric: Metric, entry: BaselineEntry | None, *, settings: Settings,
             hardware_id: str, samples: list[float] | None = None, attempts: int = 1,
             tainted: list[str] | None = None, baseline_id: str | None = None, fallback: bool = False,
             diff: FingerprintDiff | None = None, workload: dict | None = None) -> MetricResult:
    """Verdict for ``metric`` (or for ``samples`` pooled over re-measurements) against ``entry``.

    ``baseline_id``/``fallback``: the id the entry came from (perfgate.judge.baseline_choice); ``diff``:
    how that baseline's machine differs from this one (perfgate.judge.fingerprint_check). An absolute
    metric against a differing machine is ``not-comparable``, and so is any metric whose baseline
    identified another ``workload`` (the served model, its flags: PerfRecorder.identify); a
    not-gated one that got worse by a factor no measured noise explains fails through the
    gross-change guard (perfgate.judge.guard)."""
    values = samples if samples is not None else list(metric.summary.samples)
    summary = summarize(values)
    tol = tolerance(settings, test_id, metric, entry)
    absolute = metric.family == "fraction"
    if entry is None:
        verdict = decide(None, values, better=metric.better, tol=tol, absolute_tol=absolute)
    elif (moved := other_workload(entry.workload, workload, tol)) is not None:
        verdict = moved
    elif diff is not None and not diff.comparable and not metric.is_ratio:
        verdict = not_comparable(diff, tol)
    else:
        if entry.unit != metric.unit or entry.better != metric.better:
            raise ValueError(f"{test_id} {metric.name}: baseline is {entry.unit}/{entry.better}-is-better, "
                             f"the test now records {metric.unit}/{metric.better}; refresh the baseline")
        if absolute:
            check_fraction_range(test_id, metric.name, metric.better, entry.summary.median, tol)
        few = entry.summary.n < MIN_SAMPLES_FOR_RANK_TEST or len(entry.summary.samples) < MIN_SAMPLES_FOR_RANK_TEST
        exact = entry.provenance.startswith("measured") and is_exact(entry.summary.samples, entry.summary.n, values)
        base_median = entry.summary.median if few and not exact else None
        runs = [RunSummary.from_dict(r) for r in entry.runs]
        capped = None
        if len(runs) >= run_noise.MIN_RUNS and not exact:  # between-run model: vs the run medians, tol >= k x spread
            capped = run_noise.cap_note(tol, runs, absolute=absolute)
            tol = run_noise.effective_tolerance(tol, runs, absolute=absolute)
            base_median = run_noise.center(runs)
        verdict = decide(list(entry.summary.samples), values, better=metric.better, tol=tol, absolute_tol=absolute,
                         abs_floor=ABS_FLOORS.get(metric.unit, 0.0), baseline_median=base_median, exact=exact)
        if capped:
            verdict = replace(verdict, explanation=f"{verdict.explanation}; {capped}")
    gated = (is_gated(metric.unit, hardware_id, settings.gate) and not tainted
             and (settings.gate == "all" or settings.record_only_reason(test_id, metric.name) is None))
    if (entry is not None and not gated and not tainted and not fallback and metric.family != "fraction"
            and verdict.outcome is not Outcome.NOT_COMPARABLE):
        tripped = guard.check(settings.gross_change, test_id, metric.name, entry, summary.median, tol=tol,
                              context=diff.context if diff else None, unverified=diff.unverified if diff else None)
        if tripped is not None:
            verdict, gated = tripped, True
    base = baseline_view(entry) if entry else None
    if base is not None and baseline_id is not None:
        base["hardware_id"], base["fallback"] = baseline_id, fallback
    return MetricResult(test_id=test_id, area=area_of(test_id), metric=metric.name, unit=metric.unit,
                        better=metric.better, tol=tol, gated=gated, summary=summary, verdict=verdict.to_dict(),
                        baseline=base, attempts=attempts,
                        rerun=f"pytest '{test_id}'", tainted=list(tainted or []), workload=workload)
