"""The gross-change guard: a recorded-only figure may not move by a factor no measured noise explains.

Absolute figures on CPU ids, ``record_only`` patterns and the absolute figures of
``--perf-gate=ratios`` are recorded, not gated: their run-to-run noise is wider than any useful
tolerance. Record-only must still never mean "anything goes": a serving TTFT 26x its baseline on
a machine whose fingerprint matches is not noise (issue 16). So a not-gated figure that got worse
by more than a factor fails the test, with the factor and the fingerprint's software and
stored-only differences in the message.

The factor of one metric is the larger of the configured default (3x) and ``margin`` times the
worst swing the baseline itself measured (its worst sample, or worst run median stored by
`perfgate calibrate`, against its median): noise that was measured widens the guard, noise that
was not does not. Metrics known to swing more than their stored samples show get their own
factor under ``[gross_change.factors]`` (a glob like the tolerance overrides; the most specific
pattern wins, perfgate.judge.patterns).
Only worsening counts: a gated metric that improves passes, so a recorded-only one must too.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from perfgate.judge.baseline_entry import BaselineEntry
from perfgate.judge.patterns import PatternTable
from perfgate.judge.verdict import Outcome, Verdict, worsening

DEFAULT_FACTOR = 3.0
DEFAULT_MARGIN = 2.0


class GuardConfigError(ValueError):
    """A [gross_change] setting is malformed; the message names the file and key."""


@dataclass
class GuardSettings:
    factor: float = DEFAULT_FACTOR
    margin: float = DEFAULT_MARGIN
    factors: PatternTable = field(default_factory=PatternTable)  # "test_id_glob[@metric_glob]" -> factor

    def __post_init__(self):  # GuardSettings(factors={...}): the same table
        self.factors = PatternTable(self.factors)

    def factor_for(self, test_id: str, metric: str) -> float | None:
        """The configured factor of the most specific matching pattern, or None."""
        return self.factors.lookup(test_id, metric)


def _factor_value(value, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 1:
        raise GuardConfigError(f"{where}: must be a number above 1 (a factor such as 3.0), got {value!r}")
    return float(value)


def apply(settings: GuardSettings, table: dict, where: str) -> None:
    """Read a ``[gross_change]`` table (``factor``, ``margin``, ``factors``) on top of ``settings``."""
    if not isinstance(table, dict):
        raise GuardConfigError(f"{where}: must be a table with factor, margin and factors, got {table!r}")
    unknown = set(table) - {"factor", "margin", "factors"}
    if unknown:
        raise GuardConfigError(f"{where}: unknown key(s) {sorted(unknown)}; known: factor, margin, factors")
    if "factor" in table:
        settings.factor = _factor_value(table["factor"], f"{where}.factor")
    if "margin" in table:
        m = table["margin"]
        if isinstance(m, bool) or not isinstance(m, (int, float)) or not math.isfinite(m) or m < 1:
            raise GuardConfigError(f"{where}.margin: must be a number >= 1, got {m!r}")
        settings.margin = float(m)
    for pattern, value in (table.get("factors") or {}).items():
        settings.factors[pattern] = _factor_value(value, f"{where}.factors.{pattern!r}")


def worsening_factor(baseline: float, current: float, better: str) -> float:
    """How many times worse ``current`` is (1.0: same; below 1: better). inf where it fell to zero."""
    if baseline <= 0 or current < 0:
        return 1.0  # no meaningful factor for signed or zero baselines
    if better == "lower":
        return current / baseline
    return math.inf if current == 0 else baseline / current


def measured_swing(entry: BaselineEntry) -> float:
    """The worst worsening the baseline itself holds: its worst sample and its worst run median
    (the runs a refresh pooled, or those `perfgate calibrate` stored) against its median."""
    values = (list(entry.summary.samples) + list((entry.spread or {}).get("run_medians") or [])
              + [r["median"] for r in entry.runs if isinstance(r.get("median"), (int, float))])
    med = entry.summary.median
    return max([1.0] + [worsening_factor(med, v, entry.better) for v in values])


def limit_for(settings: GuardSettings, test_id: str, metric: str, entry: BaselineEntry) -> tuple[float, str]:
    """(factor, how it was set) for one metric: the larger of the configured factor (this test's
    under [gross_change.factors], else the default) and ``margin`` x the baseline's own worst swing.

    A configured factor widens the guard, never narrows it below measured noise: the CPU
    baseline of the SLO rate sweep held samples of 0 req/s (an infinite swing), and a configured
    20x on that test made the next run's median of 0 fail the guard (CI run of 481f343)."""
    configured = settings.factor_for(test_id, metric)
    swing = measured_swing(entry)
    if settings.margin * swing > (configured or settings.factor):
        return settings.margin * swing, (f"{settings.margin:g} x the baseline's own worst swing {swing:.2f}x")
    if configured is not None:
        return configured, "configured for this test under [gross_change.factors]"
    return settings.factor, (f"default; the baseline's worst swing {swing:.2f}x x margin {settings.margin:g} "
                             f"is below it")


def check(settings: GuardSettings, test_id: str, metric: str, entry: BaselineEntry, current_median: float,
          *, tol: float, context: list[str] | None = None, unverified: list[str] | None = None) -> Verdict | None:
    """A failing verdict when ``current_median`` is worse than the baseline by more than the limit."""
    moved = worsening_factor(entry.summary.median, current_median, entry.better)
    limit, how = limit_for(settings, test_id, metric, entry)
    if moved <= limit:
        return None
    shown = "inf" if math.isinf(moved) else f"{moved:.1f}"
    differences = "; ".join(context or []) or "none (same hardware fields and software versions)"
    if unverified:
        differences += f"; not recorded with the baseline, so unchecked: {', '.join(unverified)}"
    return Verdict(
        Outcome.REGRESSION, worsening(entry.summary.median, current_median, entry.better), tol, None,
        f"gross change: recorded-only figure {shown}x worse than its baseline ({entry.summary.median:.4g} -> "
        f"{current_median:.4g}), beyond the {limit:.1f}x limit ({how}) that no measured noise explains. "
        f"Fingerprint differences: {differences}. If the machine changed, its id or fingerprint should show it; "
        f"if the change is expected, refresh the baseline; if the metric swings this much on this machine, "
        f"set [gross_change.factors] in its tolerances.toml with the reason")
