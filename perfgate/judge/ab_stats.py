"""Same-machine A/B arithmetic: paired per-round ratios, a Student t interval, a verdict.

Pure functions, no I/O (`perfgate ab` in perfgate/commands/ab.py runs the rounds). Why
paired rounds: on a shared machine or a scheduler's allocation the level of a number drifts between runs
by more than the change we want to see; A and B measured back to back in one round share
that level, so the per-round ratio B/A cancels it. The interval is Student's t over rounds
(rounds, not samples, are the independent observations) of the mean log ratio, i.e. of
the geometric mean of the ratios; it is deterministic, so a results file reproduces its verdict.

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
from scipy.stats import t as student_t

from perfgate.judge.verdict import Outcome

DEFAULT_THRESHOLD = 0.03
DEFAULT_CONFIDENCE = 0.95
MIN_ROUNDS = 3


def round_order(rounds: int) -> list[tuple[str, str]]:
    """A B, B A, A B, ...: each side goes first in half the rounds, so a steady drift within a
    session biases neither side."""
    return [("a", "b") if i % 2 == 0 else ("b", "a") for i in range(rounds)]


def t_interval(values: Sequence[float], *, confidence: float = DEFAULT_CONFIDENCE) -> tuple[float, float]:
    """Two-sided Student t interval of the mean of ``values`` (the per-round log ratios).

    Not a bootstrap: a percentile bootstrap over a handful of rounds can never reach past the
    lowest and highest round, so an A = A run of 4 rounds that all happened to read B/A > 1.03
    was a "regression" (CI, quiet machine: B/A 1.319 [1.101, 1.496]; single pytest runs of the
    same gloo all_reduce read 1,070-2,148 us there). Student's t widens the interval by what
    few rounds do not know about the spread; with 4 rounds it is 3.18 standard errors each side."""
    arr = np.asarray(list(values), dtype=float)
    if arr.size < 2:
        raise ValueError("an interval needs at least 2 values")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be between 0 and 1, got {confidence}")
    mean = float(arr.mean())
    sem = float(arr.std(ddof=1)) / math.sqrt(arr.size)
    if sem == 0:
        return mean, mean
    lo, hi = student_t.interval(confidence, arr.size - 1, loc=mean, scale=sem)
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
           threshold: float = DEFAULT_THRESHOLD, confidence: float = DEFAULT_CONFIDENCE) -> PairedResult:
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
    lo, hi = t_interval(logs, confidence=confidence)
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
