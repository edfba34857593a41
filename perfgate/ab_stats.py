"""Same-machine A/B arithmetic: paired per-round ratios, a bootstrap interval, a verdict.

Pure functions, no I/O (`perfgate ab` in perfgate/commands/ab.py runs the rounds). Why
paired rounds: on a shared or leased machine the level of a number drifts between runs
by more than the change we want to see; A and B measured back to back in one round share
that level, so the per-round ratio B/A cancels it. The interval is a percentile bootstrap
over rounds (rounds, not samples, are the independent observations) of the geometric mean
of the ratios, seeded so a verdict is reproducible from its results file.

Worsening follows verdict.worsening: for lower-is-better metrics B/A - 1, for
higher-is-better ones 1 - B/A; positive is worse. A metric is a **regression** when the
whole interval of its worsening lies beyond the threshold, **improved** when the whole
interval lies beyond it on the better side, **noisy** when the point estimate is beyond
the threshold but the interval is not, else **pass**.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from scipy.stats import norm
from scipy.stats import t as student_t

from perfgate.verdict import Outcome

DEFAULT_THRESHOLD = 0.03
DEFAULT_CONFIDENCE = 0.95
DEFAULT_RESAMPLES = 10_000
MIN_ROUNDS = 3


def round_order(rounds: int) -> list[tuple[str, str]]:
    """A B, B A, A B, ...: each side goes first in half the rounds, so a steady drift within a
    session biases neither side."""
    return [("a", "b") if i % 2 == 0 else ("b", "a") for i in range(rounds)]


def expanded_tail(confidence: float, n: int) -> float:
    """The tail probability an expanded percentile bootstrap reads its interval at (Hesterberg 2015).

    A plain percentile interval over a handful of rounds is too narrow: the bootstrap ignores
    that the spread itself was estimated from n values (it uses the plug-in SD, and z where
    Student's t applies). Expanding to z = sqrt(n / (n - 1)) x t(n - 1) fixes both; on 2 cores
    shared with other jobs an A = A run read "improved, [0.64, 0.96]" over 6 rounds without it."""
    t = float(student_t.ppf(1 - (1 - confidence) / 2, n - 1))
    return float(norm.sf(math.sqrt(n / (n - 1)) * t))


def bootstrap_interval(values: Sequence[float], *, confidence: float = DEFAULT_CONFIDENCE,
                       resamples: int = DEFAULT_RESAMPLES, seed: int = 0) -> tuple[float, float]:
    """Two-sided expanded percentile bootstrap interval of the mean of ``values``."""
    arr = np.asarray(list(values), dtype=float)
    if arr.size < 2:
        raise ValueError("a bootstrap interval needs at least 2 values")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be between 0 and 1, got {confidence}")
    rng = np.random.default_rng(seed)
    means = arr[rng.integers(0, arr.size, size=(resamples, arr.size))].mean(axis=1)
    tail = expanded_tail(confidence, arr.size)
    lo, hi = np.quantile(means, [tail, 1 - tail])
    return float(lo), float(hi)


def _worsening(ratio: float, better: str) -> float:
    return ratio - 1 if better == "lower" else 1 - ratio


@dataclass(frozen=True)
class PairedResult:
    """One metric's A/B comparison over rounds."""

    ratio: float                      # geometric mean of the per-round B/A ratios
    ratio_ci: tuple[float, float]
    change: float                     # worsening of B against A at the point estimate (> 0 worse)
    change_ci: tuple[float, float]    # (low, high) worsening
    ratios: tuple[float, ...]
    outcome: Outcome
    explanation: str


def paired(a_medians: Sequence[float], b_medians: Sequence[float], *, better: str,
           threshold: float = DEFAULT_THRESHOLD, confidence: float = DEFAULT_CONFIDENCE,
           resamples: int = DEFAULT_RESAMPLES, seed: int = 0) -> PairedResult:
    """Gate B against A on rounds of (A median, B median) measured back to back."""
    if better not in ("higher", "lower"):
        raise ValueError(f"better must be 'higher' or 'lower', got {better!r}")
    if len(a_medians) != len(b_medians):
        raise ValueError(f"A has {len(a_medians)} rounds and B {len(b_medians)}: rounds must pair up")
    if len(a_medians) < MIN_ROUNDS:
        raise ValueError(f"{len(a_medians)} round(s): an interval needs at least {MIN_ROUNDS}")
    if not (threshold >= 0 and math.isfinite(threshold)):
        raise ValueError(f"threshold must be a non-negative number, got {threshold}")
    pairs = [(float(a), float(b)) for a, b in zip(a_medians, b_medians)]
    if any(a <= 0 or b <= 0 or not math.isfinite(a) or not math.isfinite(b) for a, b in pairs):
        raise ValueError("A/B ratios need positive finite medians; this metric had zero or negative ones")
    logs = [math.log(b / a) for a, b in pairs]
    ratio = math.exp(sum(logs) / len(logs))
    lo, hi = bootstrap_interval(logs, confidence=confidence, resamples=resamples, seed=seed)
    ratio_ci = (math.exp(lo), math.exp(hi))
    ends = sorted(_worsening(r, better) for r in ratio_ci)
    change = _worsening(ratio, better)
    shown = (f"B/A {ratio:.3f} [{ratio_ci[0]:.3f}, {ratio_ci[1]:.3f}] ({confidence:.0%} interval over "
             f"{len(pairs)} rounds): {'worse' if change > 0 else 'better'} by {abs(change) * 100:.1f}% "
             f"[{ends[0] * 100:+.1f}%, {ends[1] * 100:+.1f}%], threshold {threshold * 100:.1f}%")
    if ends[0] > threshold:
        outcome = Outcome.REGRESSION
    elif ends[1] < -threshold:
        outcome = Outcome.IMPROVED
    elif change > threshold:
        outcome = Outcome.NOISY
        shown += ": beyond the threshold, but the interval reaches inside it (more rounds would tell)"
    else:
        outcome = Outcome.PASS
    return PairedResult(ratio=ratio, ratio_ci=ratio_ci, change=change, change_ci=(ends[0], ends[1]),
                        ratios=tuple(b / a for a, b in pairs), outcome=outcome, explanation=shown)
