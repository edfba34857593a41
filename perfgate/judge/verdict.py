"""Regression decisions: pure functions over numbers, no I/O.

A change must be both *large* (relative change of medians beyond the tolerance) and
*significant* (one-sided Mann-Whitney U on the samples) to count as a regression. A large
but insignificant change is ``noisy``: re-measured, then reported. With baselines that
carry too few samples for a rank test (imported reference numbers), a sign test asks
whether every current sample lies beyond the tolerance band around the baseline median.
"""
from __future__ import annotations

import enum
import math
from dataclasses import asdict, dataclass, replace
from typing import Sequence

from scipy import stats

ALPHA = 0.05
MIN_SAMPLES_FOR_RANK_TEST = 3
# The fewest samples of a run with which a change can reach significance at ALPHA whatever the
# baseline holds: the sign test's best p is 0.5 ** n (0.031 at 5, 0.0625 at 4), and a rank test of 5
# against 3 baseline samples reaches 1 / C(8, 5) = 0.018. A metric measured once per run (pytest-benchmark's
# pedantic rounds=1) could only ever be ``noisy``: the plugin re-measures a suspect until it has these.
MIN_SAMPLES_TO_DECIDE = next(n for n in range(1, 64) if 0.5 ** n < ALPHA)


class Outcome(str, enum.Enum):
    PASS = "pass"
    REGRESSION = "regression"
    NOISY = "noisy"
    IMPROVED = "improved"
    NEW = "new"
    NOT_COMPARABLE = "not-comparable"  # the baseline's machine differs in a performance field


@dataclass(frozen=True)
class Verdict:
    outcome: Outcome
    change: float | None  # signed worsening: > 0 is worse; relative, or absolute for fractions
    tol: float
    p_value: float | None
    explanation: str
    # the reference level the change was computed from (median of the baseline's samples, of its run
    # medians, or its reported median): what a report shows beside the current median
    baseline_median: float | None = None

    def to_dict(self) -> dict:
        d = asdict(self)
        d["outcome"] = self.outcome.value
        return d


def worsening(baseline: float, current: float, better: str, *, absolute: bool = False) -> float:
    """How much worse ``current`` is than ``baseline`` (negative: better).

    Relative to the baseline unless ``absolute`` (for fractions, where 0.30 -> 0.33 is a
    change of 0.03 whatever the base)."""
    diff = (baseline - current) if better == "higher" else (current - baseline)
    if absolute:
        return diff
    if baseline == 0:
        return 0.0 if diff == 0 else math.copysign(math.inf, diff)
    return diff / abs(baseline)


def _p_worse(baseline: Sequence[float], current: Sequence[float], better: str) -> float:
    """One-sided p-value that current is stochastically worse than baseline."""
    alternative = "less" if better == "higher" else "greater"
    return float(stats.mannwhitneyu(current, baseline, alternative=alternative, method="auto").pvalue)


def _p_beyond(band_edge: float, current: Sequence[float], better: str, worse: bool) -> float:
    """Sign test: p of seeing this many samples beyond the band edge if each were a coin flip."""
    if worse:
        k = sum(1 for x in current if (x < band_edge if better == "higher" else x > band_edge))
    else:
        k = sum(1 for x in current if (x > band_edge if better == "higher" else x < band_edge))
    return float(stats.binomtest(k, len(current), 0.5, alternative="greater").pvalue)


def decide(
    baseline: Sequence[float] | None,
    current: Sequence[float],
    *,
    better: str,
    tol: float,
    absolute_tol: bool = False,
    abs_floor: float = 0.0,
    alpha: float = ALPHA,
    baseline_median: float | None = None,
    current_median: float | None = None,
    rank_test: bool | None = None,
    floor_rule: str = "",
    exact: bool = False,
    either_way: bool = False,
) -> Verdict:
    """Compare current samples with baseline samples for one metric.

    ``abs_floor``: changes smaller than this in the metric's own unit always pass (a 1 us
    swing on a 15 us NCCL latency is 7 % and meaningless); ``floor_rule`` names it in the
    explanation where it decides ("the 2 us floor of ..."). ``baseline_median`` and
    ``current_median`` override the medians of ``baseline`` and ``current``: the medians of every
    sample a run took, where only a summary of them was stored. ``rank_test``: whether the samples
    may be rank-tested (default: unless ``baseline_median`` is given, as for imported reference
    numbers that carry a median, not samples); otherwise a sign test against the tolerance band.
    ``exact``: the value is deterministic (see :func:`is_exact`), so a change beyond tolerance
    is certain and needs no significance test (a one-sample metric could never reach one).
    ``either_way``: with ``exact``, a change beyond tolerance in the better direction fails too. For
    exact counts (they depend on no machine): 7 all-reduces per step -> 1 reads "fewer is better",
    but an exact count that moved means the code now does something else (there, every gradient in
    one bucket: no overlap of communication with backward), and only a refresh may say it is meant.
    """
    if better not in ("higher", "lower"):
        raise ValueError(f"better must be 'higher' or 'lower', got {better!r}")
    if tol < 0 or not math.isfinite(tol):
        raise ValueError(f"tolerance must be a non-negative finite number, got {tol!r}")
    if not current:
        raise ValueError("no current samples")
    cur = sorted(_finite(x, "current sample") for x in current)
    cur_med = _finite(current_median, "current median") if current_median is not None else _median(cur)
    if baseline is None or (not baseline and baseline_median is None):
        return Verdict(Outcome.NEW, None, tol, None, "no baseline for this test and hardware id")
    base = [_finite(x, "baseline sample") for x in baseline]
    _finite(abs_floor, "absolute floor")
    base_med = _finite(baseline_median, "baseline median") if baseline_median is not None else _median(sorted(base))
    verdict = _decide(base, base_med, cur, cur_med, better=better, tol=tol, absolute_tol=absolute_tol,
                      abs_floor=abs_floor, alpha=alpha, exact=exact, either_way=either_way, floor_rule=floor_rule,
                      rank_test=baseline_median is None if rank_test is None else rank_test)
    if math.isnan(verdict.change):  # cannot happen with finite inputs; never let it read as a pass
        raise ValueError(f"the change from {base_med!r} to {cur_med!r} is not a number")
    return replace(verdict, baseline_median=base_med)


def _finite(x, what: str) -> float:
    """A finite float, or ValueError: no NaN or infinity may reach a comparison, where every test
    against NaN is false and a verdict falls through to ``pass`` (issue 27)."""
    if isinstance(x, (bool, str, bytes)) or x is None:
        raise ValueError(f"{what} {x!r} is not a number")
    value = float(x)
    if not math.isfinite(value):
        raise ValueError(f"{what} {value!r} is not a finite number: a measurement failed or a file is damaged")
    return value


def _decide(base: list[float], base_med: float, cur: list[float], cur_med: float, *, better: str, tol: float,
            absolute_tol: bool, abs_floor: float, alpha: float, rank_test: bool, exact: bool,
            either_way: bool = False, floor_rule: str = "") -> Verdict:
    change = worsening(base_med, cur_med, better, absolute=absolute_tol)
    unit_word = "" if absolute_tol else "%"
    shown = f"{change * (1 if absolute_tol else 100):+.{3 if absolute_tol else 1}f}{unit_word}"
    limit = f"{tol * (1 if absolute_tol else 100):.{3 if absolute_tol else 1}f}{unit_word}"
    # a hair of slack: a change of exactly `tol` must not fail through float rounding
    if abs(change) <= tol * (1 + 1e-9) + 1e-12:
        return Verdict(Outcome.PASS, change, tol, None, f"change {shown} within tolerance {limit}")
    if abs(cur_med - base_med) <= abs_floor:
        return Verdict(Outcome.PASS, change, tol, None,
                       f"change {shown} is beyond tolerance {limit}, but its size {abs(cur_med - base_med):.3g} is "
                       f"below {floor_rule or f'the absolute floor {abs_floor:g}'}: passed by the floor")
    worse = change > 0
    if exact and either_way and not worse:
        return Verdict(Outcome.REGRESSION, change, tol, 0.0,
                       f"changed by {shown} ({base_med:g} -> {cur_med:g}; tolerance {limit}), in the 'better' "
                       f"direction, of an exact count: it depends on no machine, so the code now does something "
                       f"else; if that is intended, refresh the baseline")
    if exact:
        return Verdict(Outcome.REGRESSION if worse else Outcome.IMPROVED, change, tol, 0.0,
                       f"{'worse' if worse else 'better'} by {shown if worse else shown[1:]} (tolerance {limit}), "
                       f"a deterministic value ({base_med:g} in every baseline sample, {cur_med:g} in every sample here)")
    if len(base) >= MIN_SAMPLES_FOR_RANK_TEST and len(cur) >= MIN_SAMPLES_FOR_RANK_TEST and rank_test:
        p = _p_worse(base, cur, better) if worse else _p_worse(cur, base, better)
        test = "Mann-Whitney U"
    else:
        sign = 1 if (better == "higher") == (not worse) else -1
        edge = base_med + sign * (tol if absolute_tol else tol * abs(base_med))
        p = _p_beyond(edge, cur, better, worse)
        test = "sign test vs tolerance band"
    significant = p < alpha
    if worse and significant:
        return Verdict(Outcome.REGRESSION, change, tol, p,
                       f"worse by {shown} (tolerance {limit}), {test} p={p:.3g}")
    if worse:
        never = ("" if best_p_value(len(base), len(cur), rank_test=test == "Mann-Whitney U") < alpha else
                 f"; {len(cur)} sample(s) can never reach p < {alpha:g}: a verdict needs {MIN_SAMPLES_TO_DECIDE}")
        return Verdict(Outcome.NOISY, change, tol, p,
                       f"worse by {shown} (tolerance {limit}) but not significant ({test} p={p:.3g}{never}): noisy")
    if significant:
        return Verdict(Outcome.IMPROVED, change, tol, p,
                       f"better by {shown[1:]} ({test} p={p:.3g}): consider refreshing the baseline")
    return Verdict(Outcome.PASS, change, tol, p, f"better by {shown[1:]}, not significant")


def best_p_value(n_baseline: int, n_current: int, *, rank_test: bool) -> float:
    """The smallest one-sided p the test can give these sample counts: every current sample beyond the
    band (sign test: 0.5 ** n) or beyond every baseline sample (rank test: 1 / C(n + m, n))."""
    if rank_test:
        return 1.0 / math.comb(n_baseline + n_current, n_current)
    return 0.5 ** n_current


def is_exact(baseline: Sequence[float], baseline_n: int, current: Sequence[float]) -> bool:
    """A deterministic value (a parameter-count ratio, a simulated hit rate of one trace): the
    baseline pooled over at least two runs has no spread, and neither has this run."""
    return (baseline_n >= 2 and len(baseline) >= 1 and len(current) >= 1
            and min(baseline) == max(baseline) and min(current) == max(current))


def _median(sorted_values: Sequence[float]) -> float:
    n = len(sorted_values)
    mid = n // 2
    # halves first: (a + b) / 2 overflows to inf for two values near the float limit
    return sorted_values[mid] if n % 2 else sorted_values[mid - 1] / 2 + sorted_values[mid] / 2


def fails(outcome: Outcome, *, strict: bool = False) -> bool:
    """Whether an outcome fails a gated test. Noisy fails only under --perf-strict."""
    return outcome is Outcome.REGRESSION or (strict and outcome is Outcome.NOISY)
