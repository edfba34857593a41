"""``--json``: what a command's table says, as one JSON document on stdout, for a program to read.

`perfgate compare`, `perfgate trends` and `perfgate verify-baselines` print a table for a person; with
``--json`` they print the same content as one document instead (nothing else on stdout, the exit status
unchanged), its numbers as numbers: a change of +5 % is ``0.05``, never the text ``"+5.0%"``. A document
names its ``kind`` and ``schema_version`` as perfgate's files do, so a reader can refuse one it does not know.
"""
from __future__ import annotations

import json
import math
import sys
from typing import Any

from perfgate.judge import outcomes
from perfgate.judge.metric_result import MetricResult
from perfgate.report.run_report import baseline_median

SCHEMA_VERSION = 1


def add_json_option(parser, what: str) -> None:
    parser.add_argument("--json", action="store_true",
                        help=f"print {what} as one JSON document on stdout instead of the table (same content, "
                             f"numbers as numbers; the exit status is the same)")


def _finite(value: Any) -> Any:
    """The value with every non-finite float as null: JSON has no NaN, and a reader must not meet one."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def emit(kind: str, body: dict) -> None:
    """Print ``body`` as the document of ``kind`` (``perfgate-<kind>``)."""
    doc = {"kind": f"perfgate-{kind}", "schema_version": SCHEMA_VERSION, **body}
    sys.stdout.write(json.dumps(_finite(doc), indent=1, allow_nan=False) + "\n")


def value_change(r: MetricResult) -> float | None:
    """The change as the table shows it, as a number: of the value, not of its worseness (+0.05: the number
    went up 5 %), absolute for fractions."""
    change = r.verdict.get("change")
    if change is None:
        return None
    return -change if r.better == "higher" else change


def metric_record(r: MetricResult) -> dict:
    """One row of the metric table (perfgate.report.run_report.METRIC_COLUMNS), with what decided it."""
    base = r.baseline or {}
    return {"test_id": r.test_id, "metric": r.metric, "baseline": baseline_median(r), "current": r.summary.median,
            "unit": r.unit, "change": value_change(r), "change_is_absolute": r.unit == "fraction", "tol": r.tol,
            "verdict": outcomes.label(r), "outcome": r.outcome, "gated": r.gated,
            "explanation": r.verdict.get("explanation", ""), "baseline_hardware_id": base.get("hardware_id"),
            "baseline_provenance": base.get("provenance"), "tainted": list(r.tainted), "rerun": r.rerun}
