"""Turn one recorded metric and its baseline entry into a MetricResult with a verdict.

The one place that judges a metric: *whether* it is gated (perfgate.judge.policy decides),
*which* tolerance applies, and whether its baseline's machine or workload voids the comparison
(perfgate.judge.fingerprint_check, by what the metric depends on). Used by the plugin during a
run and by `perfgate compare` on saved results, so both agree.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from perfgate.judge import guard, load_bound, run_noise
from perfgate.judge.baseline_choice import Choice
from perfgate.judge.baseline_entry import BaselineEntry
from perfgate.judge.config import ConfigError, Settings, floor_of
from perfgate.judge.fingerprint_check import host_paced_note, judged_dependency, not_comparable, other_workload
from perfgate.judge.metric_result import MetricResult, area_of
from perfgate.judge.metrics import Metric, summarize
from perfgate.judge.policy import GatePolicy, load_moves
from perfgate.judge.run_noise import RunSummary
from perfgate.judge.verdict import MIN_SAMPLES_FOR_RANK_TEST, Outcome, decide, is_exact


@dataclass(frozen=True)
class Context:
    """What is the same for every metric one session (or one `perfgate compare`) judges."""

    settings: Settings
    policy: GatePolicy
    tainted: tuple[str, ...] = ()  # why the machine was busy; voids what load moves (policy.load_moves)
    # how busy, where only CPU load tainted (the load watch): bounds what it explains (judge.load_bound)
    foreign_load: load_bound.ForeignLoad | None = None

    @classmethod
    def of(cls, settings: Settings, hardware_id: str, tainted=()) -> "Context":
        return cls(settings, GatePolicy.of(hardware_id, settings), tuple(tainted or ()))


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
            "run_medians": [r["median"] for r in entry.runs], "workload": entry.workload,
            **({"device_busy": entry.device_busy} if entry.device_busy is not None else {})}


def samples_seen(summary, entry: BaselineEntry, attempts: int) -> str:
    """How many samples the verdict saw, for its explanation: all of this run's (pooled over its
    measurements where it was re-measured), against the baseline's stored ones and the count they stand for."""
    here = f"{summary.n:,} sample(s) here" + (f" from {attempts} measurements" if attempts > 1 else "")
    stored, n = len(entry.summary.samples), entry.summary.n
    there = f"{n:,} in the baseline" + (f" ({stored} stored)" if stored < n else "")
    return f"{here}, {there}"


def evaluate(test_id: str, metric: Metric, choice: Choice, context: Context, *,
             samples: list[float] | None = None, attempts: int = 1, workload: dict | None = None) -> MetricResult:
    """Verdict for ``metric`` (or for ``samples`` pooled over re-measurements) against ``choice``.

    ``choice``: the baseline entry, the id it came from and how that id's machine differs from this
    one (perfgate.judge.baseline_choice). A metric against a machine that differs in a field it
    depends on is ``not-comparable`` (a host-bound timing busy >= DEVICE_BOUND on the device here
    and in the baseline is judged as a device figure), and so is any metric whose baseline
    identified another ``workload`` (the served model, its flags: PerfRecorder.identify); a
    not-gated one that got worse by a factor no measured noise explains fails through the
    gross-change guard (perfgate.judge.guard)."""
    settings, entry, diff = context.settings, choice.entry, choice.diff
    # every sample: the metric's own (all it recorded; the stored quantiles for one read from a file), or
    # every attempt's pooled; the medians are of all samples either way (metrics.Summary)
    summary = summarize(samples) if samples is not None else metric.summary
    values = list(summary.samples)
    tol = tolerance(settings, test_id, metric, entry)
    absolute = metric.family == "fraction"
    dependency = judged_dependency(metric.dependency, metric.device_busy, entry.device_busy if entry else None)
    if entry is None:
        verdict = decide(None, values, better=metric.better, tol=tol, absolute_tol=absolute)
    elif (moved := other_workload(entry.workload, workload, tol)) is not None:
        verdict = moved
    elif diff is not None and (void := not_comparable(diff, dependency, tol, busy_here=metric.device_busy,
                                                      busy_baseline=entry.device_busy)) is not None:
        verdict = void
    else:
        if entry.unit != metric.unit or entry.better != metric.better:
            raise ValueError(f"{test_id} {metric.name}: baseline is {entry.unit}/{entry.better}-is-better, "
                             f"the test now records {metric.unit}/{metric.better}; refresh the baseline")
        if absolute:
            check_fraction_range(test_id, metric.name, metric.better, entry.summary.median, tol)
        few = entry.summary.n < MIN_SAMPLES_FOR_RANK_TEST or len(entry.summary.samples) < MIN_SAMPLES_FOR_RANK_TEST
        exact = entry.provenance.startswith("measured") and is_exact(entry.summary.samples, entry.summary.n, values)
        base_median = entry.summary.median  # of all the baseline's samples, not of the ones it stored
        runs = [RunSummary.from_dict(r) for r in entry.runs]
        capped = None
        if len(runs) >= run_noise.MIN_RUNS and not exact:  # between-run model: vs the run medians, tol >= k x spread
            capped = run_noise.cap_note(tol, runs, absolute=absolute)
            tol = run_noise.effective_tolerance(tol, runs, absolute=absolute)
            base_median = run_noise.center(runs)
        floor, floor_rule = floor_of(metric.unit, metric.floor)
        verdict = decide(list(entry.summary.samples), values, better=metric.better, tol=tol, absolute_tol=absolute,
                         abs_floor=floor, floor_rule=floor_rule, baseline_median=base_median,
                         current_median=summary.median, rank_test=not few, exact=exact,
                         either_way=dependency == "nothing")
        pooled_from = attempts if samples is not None else 1
        verdict = replace(verdict, explanation=f"{verdict.explanation}; {samples_seen(summary, entry, pooled_from)}")
        if capped:
            verdict = replace(verdict, explanation=f"{verdict.explanation}; {capped}")
        if verdict.outcome is Outcome.REGRESSION and (paced := host_paced_note(metric.device_busy,
                                                                                 entry.device_busy)):
            verdict = replace(verdict, explanation=f"{verdict.explanation}; {paced}")
    taint = context.tainted if load_moves(dependency) else ()  # a busy machine moves no count
    gated = context.policy.gates(test_id, metric.name, dependency, tainted=bool(taint))
    if taint and not gated and context.policy.gates(test_id, metric.name, dependency) and metric.family != "fraction":
        beyond = load_bound.beyond_load(verdict, context.foreign_load, current_median=summary.median,
                                        better=metric.better, tol=tol)
        if beyond is not None:  # worse than the measured load explains: fails, tainted or not
            verdict, gated = beyond, True
    if (entry is not None and not gated and not taint and not choice.fallback
            and metric.family != "fraction" and verdict.outcome is not Outcome.NOT_COMPARABLE):
        tripped = guard.check(settings.gross_change, test_id, metric.name, entry, summary.median, tol=tol,
                              context=diff.context if diff else None, unverified=diff.unverified if diff else None)
        if tripped is not None:
            verdict, gated = tripped, True
    base = baseline_view(entry) if entry else None
    if base is not None and choice.hardware_id is not None:
        base["hardware_id"], base["fallback"] = choice.hardware_id, choice.fallback
        if choice.reach:
            base["reach"] = choice.reach
    return MetricResult(test_id=test_id, area=area_of(test_id), metric=metric.name, unit=metric.unit,
                        better=metric.better, tol=tol, gated=gated, summary=summary, verdict=verdict.to_dict(),
                        baseline=base, attempts=attempts, rerun=f"pytest '{test_id}'",
                        tainted=list(taint), workload=workload, depends=metric.depends,
                        device_busy=metric.device_busy, declared_tol=metric.tol, floor=metric.floor)
