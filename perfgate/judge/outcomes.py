"""What each metric's verdict means for the run: its word, whether it needs a look, the counts.

The verdict stored in results (pass, regression, noisy, improved, new) is the outcome of the
comparison and stays as it is. What it means for the run depends on gating: a metric that
is only recorded (absolute figures on cpu-* ids, a machine's record_only table, a busy
machine) cannot fail the run, so a change beyond tolerance there is not a "regression" but
``worse (recorded)``, and it is counted apart from the gated outcomes everywhere: the
terminal, the Markdown summary and the ``summary`` block of the results JSON.
"""
from __future__ import annotations

from typing import Iterable

from perfgate.judge.metric_result import MetricResult

# a recorded-only metric's outcome, in words that do not claim it failed anything
RECORDED_WORD = {"pass": "pass", "regression": "worse", "noisy": "noisy", "improved": "better", "new": "new"}
# display order of the counts; outcomes added later sort after these, by name
COUNT_ORDER = ("pass", "regression", "worse", "noisy", "improved", "better", "new")
# attention rows, most urgent first; an outcome not named here ranks after "noisy"
_RANK = {"regression": 0, "noisy": 1, "improved": 3, "new": 4}
_UNKNOWN_RANK = 2


def word(r: MetricResult) -> str:
    """The outcome as counted: the verdict when gated, its recorded-only word otherwise."""
    return r.outcome if r.gated else RECORDED_WORD.get(r.outcome, r.outcome)


def label(r: MetricResult) -> str:
    """The verdict cell: ``regression``, ``worse (recorded)``, ``noisy (tainted)``..."""
    if r.gated:
        return r.outcome + (" (tainted)" if r.tainted else "")
    return f"{word(r)} ({'tainted' if r.tainted else 'recorded'})"


def needs_attention(r: MetricResult) -> bool:
    """Gated and not a pass (it failed, may fail, or moved the baseline); no baseline yet;
    or measured on a busy machine and off. Recorded-only changes are counted, not listed."""
    if r.outcome == "new":
        return True
    if r.gated:
        return r.outcome != "pass"
    return bool(r.tainted) and r.outcome != "pass"


def attention_key(r: MetricResult) -> tuple:
    """Gated rows first (they decide the run), each side by urgency, then by area and test."""
    return (0 if r.gated else 1, _RANK.get(r.outcome, _UNKNOWN_RANK), r.area, r.test_id, r.metric)


def may_fail(r: MetricResult) -> bool:
    """Gated and neither a pass, a missing baseline nor an improvement: what fails, or can."""
    return r.gated and r.outcome not in ("pass", "new", "improved")


def attention(results: Iterable[MetricResult]) -> list[MetricResult]:
    return sorted((r for r in results if needs_attention(r)), key=attention_key)


def ordered(counts: dict[str, int]) -> list[tuple[str, int]]:
    known = [(k, counts[k]) for k in COUNT_ORDER if counts.get(k)]
    return known + sorted((k, v) for k, v in counts.items() if k not in COUNT_ORDER and k != "metrics" and v)


def _bucket(results: list[MetricResult]) -> dict:
    gated: dict[str, int] = {"metrics": 0}
    recorded: dict[str, int] = {"metrics": 0}
    for r in results:
        side = gated if r.gated else recorded
        side["metrics"] += 1
        side[word(r)] = side.get(word(r), 0) + 1
    return {"gated": gated, "recorded_only": recorded, "tainted": sum(1 for r in results if r.tainted)}


def summary(results: Iterable[MetricResult]) -> dict:
    """Counts for the run and per area: gated outcomes apart from recorded-only words.

    Stored as ``summary`` in the results JSON beside the complete per-metric verdicts."""
    results = list(results)
    areas: dict[str, list[MetricResult]] = {}
    for r in results:
        areas.setdefault(r.area, []).append(r)
    out = _bucket(results)
    out["attention"] = sum(1 for r in results if needs_attention(r))
    out["areas"] = {a: _bucket(rs) for a, rs in sorted(areas.items())}
    return out
