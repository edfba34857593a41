"""Verdict logic: exhaustive cases and hypothesis properties (pure functions, no I/O)."""
from __future__ import annotations

import math

import pytest
from hypothesis import given, settings, strategies as st

from perfgate.judge.verdict import Outcome, decide, fails, worsening

BASE = [100.0, 101.0, 99.0, 100.5, 99.5, 100.2, 99.8]


def scaled(values, k):
    return [v * k for v in values]


def test_no_baseline_is_new():
    v = decide(None, BASE, better="higher", tol=0.05)
    assert v.outcome is Outcome.NEW and v.change is None


def test_within_tolerance_passes():
    assert decide(BASE, scaled(BASE, 0.97), better="higher", tol=0.05).outcome is Outcome.PASS


def test_large_significant_drop_is_regression():
    v = decide(BASE, scaled(BASE, 0.8), better="higher", tol=0.05)
    assert v.outcome is Outcome.REGRESSION
    assert v.change == pytest.approx(0.2)
    assert v.p_value < 0.05
    assert "tolerance 5.0%" in v.explanation


def test_direction_lower_is_better():
    assert decide(BASE, scaled(BASE, 1.2), better="lower", tol=0.05).outcome is Outcome.REGRESSION
    assert decide(BASE, scaled(BASE, 0.8), better="lower", tol=0.05).outcome is Outcome.IMPROVED


def test_large_but_insignificant_change_is_noisy():
    current = [70.0, 130.0, 60.0, 140.0, 85.0]  # median 85 (-15 %) but overlapping wildly
    v = decide(BASE, current, better="higher", tol=0.05)
    assert v.outcome is Outcome.NOISY
    assert not fails(v.outcome) and fails(v.outcome, strict=True)


def test_absolute_floor_ignores_tiny_latency_swings():
    base = [10.0] * 7
    cur = [11.5] * 7  # +15 % but only 1.5 us
    assert decide(base, cur, better="lower", tol=0.10, abs_floor=2.0).outcome is Outcome.PASS
    assert decide(base, cur, better="lower", tol=0.10, abs_floor=0.0).outcome is Outcome.REGRESSION


def test_fraction_tolerance_is_absolute():
    base = [0.30] * 7
    assert decide(base, [0.32] * 7, better="lower", tol=0.03, absolute_tol=True).outcome is Outcome.PASS
    v = decide(base, [0.35] * 7, better="lower", tol=0.03, absolute_tol=True)
    assert v.outcome is Outcome.REGRESSION and v.change == pytest.approx(0.05)


def test_imported_median_uses_sign_test():
    # an imported reference has one number; 5 samples all beyond the band are significant (p = 1/32)
    v = decide([11.74], [9.0, 9.1, 8.9, 9.2, 9.0], better="higher", tol=0.05, baseline_median=11.74)
    assert v.outcome is Outcome.REGRESSION and "sign test" in v.explanation
    # 3 samples can never reach p < 0.05 with a sign test: reported noisy, not failed
    v3 = decide([11.74], [9.0, 9.1, 8.9], better="higher", tol=0.05, baseline_median=11.74)
    assert v3.outcome is Outcome.NOISY


def test_three_vs_three_rank_test_cannot_be_significant():
    # DESIGN §2: with 3 vs 3 samples Mann-Whitney never goes below 0.05
    v = decide([100, 101, 102], [50, 51, 52], better="higher", tol=0.05)
    assert v.outcome is Outcome.NOISY and v.p_value >= 0.05


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="better"):
        decide(BASE, BASE, better="up", tol=0.05)
    with pytest.raises(ValueError, match="non-negative"):
        decide(BASE, BASE, better="higher", tol=-0.1)
    with pytest.raises(ValueError, match="no current samples"):
        decide(BASE, [], better="higher", tol=0.05)


def test_worsening_sign_and_zero_baseline():
    assert worsening(100, 90, "higher") == pytest.approx(0.1)
    assert worsening(100, 90, "lower") == pytest.approx(-0.1)
    assert worsening(0, 0, "lower") == 0.0
    assert math.isinf(worsening(0, 1, "lower"))


positive = st.floats(min_value=1e-3, max_value=1e6, allow_nan=False, allow_infinity=False)
samples = st.lists(positive, min_size=5, max_size=12)
direction = st.sampled_from(["higher", "lower"])
tols = st.floats(min_value=0.01, max_value=0.5)


@settings(max_examples=200, deadline=None)
@given(base=samples, ratio=st.floats(min_value=0.0, max_value=1.0), better=direction, tol=tols)
def test_change_within_tolerance_never_fails(base, ratio, better, tol):
    # every current sample is the baseline median moved by at most tol in the worse direction
    med = sorted(base)[len(base) // 2] if len(base) % 2 else None
    import statistics
    med = statistics.median(base)
    k = 1 - ratio * tol if better == "higher" else 1 + ratio * tol
    current = [med * k] * 7
    v = decide(base, current, better=better, tol=tol)
    assert v.outcome in (Outcome.PASS, Outcome.IMPROVED)
    assert not fails(v.outcome, strict=True)


@settings(max_examples=200, deadline=None)
@given(base=st.lists(st.floats(min_value=1.0, max_value=2.0), min_size=5, max_size=12), better=direction,
       tol=st.floats(min_value=0.01, max_value=0.2), factor=st.floats(min_value=1.5, max_value=10))
def test_large_separated_regression_always_fails(base, better, tol, factor):
    # baseline in [1, 2]; current entirely beyond it by a factor that exceeds any tolerance
    current = [max(base) * factor * (1 + i * 0.01) for i in range(6)] if better == "lower" else \
              [min(base) / factor / (1 + i * 0.01) for i in range(6)]
    v = decide(base, current, better=better, tol=tol)
    assert v.outcome is Outcome.REGRESSION
    assert fails(v.outcome)


@settings(max_examples=150, deadline=None)
@given(base=samples, cur=samples, tol=tols)
def test_direction_is_respected(base, cur, tol):
    # swapping the direction swaps regression and improvement, and never both
    hi = decide(base, cur, better="higher", tol=tol)
    lo = decide(base, cur, better="lower", tol=tol)
    if hi.outcome is Outcome.REGRESSION:
        assert lo.outcome in (Outcome.IMPROVED, Outcome.PASS)
    if lo.outcome is Outcome.REGRESSION:
        assert hi.outcome in (Outcome.IMPROVED, Outcome.PASS)


@settings(max_examples=150, deadline=None)
@given(base=samples, factor=st.floats(min_value=1.0, max_value=3.0), tol=tols)
def test_monotone_in_the_size_of_the_slowdown(base, factor, tol):
    # if a slowdown by `factor` is a regression, a larger slowdown is one too
    cur = [x * factor for x in base]
    worse = [x * factor * 1.5 for x in base]
    if decide(base, cur, better="lower", tol=tol).outcome is Outcome.REGRESSION:
        assert decide(base, worse, better="lower", tol=tol).outcome is Outcome.REGRESSION
