"""What sign a measured value may have: the one rule, by the unit's family, that every reader applies.

Issue 49: ``perfgate import`` took a nccl-tests time of -3236 us, pytest-benchmark round times
negated or all zero, a ``vllm bench serve`` TTFT of -35 ms, and after the negated import a run
218 % slower was judged ``pass``. The rule, applied wherever a measured number is read (``perf.record``,
results files, baselines, every importer and the seed table; perfgate.store.readers.Checker.sign
for files):

- A duration, rate, bandwidth, size or count (families latency, throughput, bandwidth, memory,
  count) is never negative: a negative one is a failed measurement (a clock read across a reset,
  a negated file), refused with the value and the key.
- No measured value of any unit is closer to zero than MIN_MAGNITUDE without being zero (subnormal
  numbers included), as none is beyond MAX_MAGNITUDE: 1e-30 s, B or GB/s is no clock's or counter's
  reading.
- In-run ratios (``x``) and fractions carry no sign rule: ``bubble_drop_vs_theory`` is a ratio of
  two changes (the measured drop of the pipeline bubble over theory's), below zero when the bubble
  grew; a ``*_saving`` fraction is below zero when a mode uses more. The unit cannot tell them from
  a speedup, so what is signed is decided by what may legitimately be so.
- Zero is a real value of perfgate's own metrics in every family (a gap of 0 ms between tokens
  that arrive in one chunk: ``itl_p50_ms`` read 0 in 19 stored CPU runs; a goodput of 0 req/s at a
  rate no request meets; a memory component not held at the peak), so a zero sample is read. But a
  duration, rate or bandwidth whose every sample is 0 measured nothing: judged against, any change
  from it is infinite, and a higher-is-better one can never fall below it. So such a metric never
  becomes a baseline (a refresh leaves it out and says so; a baseline file holding one is refused).
- A number another tool reports (``perfgate import``) summarises a run of it that worked: any value
  at or below zero, in every unit but ``fraction``, is that tool's failed run and is refused.
"""
from __future__ import annotations

from typing import Iterable

from perfgate.judge.metrics import UNIT_FAMILIES

MIN_MAGNITUDE = 1e-30
NEVER_NEGATIVE = frozenset({"latency", "throughput", "bandwidth", "memory", "count"})
ZERO_MEASURES_NOTHING = frozenset({"latency", "throughput", "bandwidth"})
_WHAT = {"latency": "a duration", "throughput": "a rate", "bandwidth": "a bandwidth", "memory": "a size",
         "count": "a count", "ratio": "a ratio", "fraction": "a fraction"}


def _shown(value: float) -> str:
    return f"{value:.6g}"


def problem(unit: object, values: Iterable[float], *, reported: bool = False) -> str | None:
    """Why ``values`` (finite numbers: one metric's samples, or one summary value) cannot be
    measurements in ``unit``, or None. ``reported``: the values are another tool's (an import),
    so none may be at or below zero unless the unit is a fraction. An unknown unit has no rule here
    (its readers refuse it by name)."""
    family = UNIT_FAMILIES.get(unit) if isinstance(unit, str) else None
    what = _WHAT.get(family or "", "a measurement")
    for v in values:
        if v != 0 and abs(v) < MIN_MAGNITUDE:
            return (f"{v!r} {unit} is closer to zero than any real measurement (0 or |x| >= {MIN_MAGNITUDE:g}): "
                    f"a failed measurement or a damaged file")
        if v < 0 and family in NEVER_NEGATIVE:
            return f"{_shown(v)} {unit} is negative, and {what} never is: a failed measurement or a damaged file"
        if reported and v <= 0 and family != "fraction":
            return (f"{_shown(v)} {unit}: {what} at or below zero is no measurement of a run that worked; "
                    f"the tool's run failed there: re-run it or leave that value out")
    return None


def any_problem(unit: object, values) -> bool:
    """Whether :func:`problem` (not ``reported``) finds anything in ``values``, a numpy array, at once."""
    import numpy as np

    family = UNIT_FAMILIES.get(unit) if isinstance(unit, str) else None
    tiny = (values != 0) & (np.abs(values) < MIN_MAGNITUDE)
    return bool(tiny.any() or (family in NEVER_NEGATIVE and (values < 0).any()))


def measured_nothing(unit: object, values: Iterable[float]) -> str | None:
    """Why a metric whose samples are ``values`` cannot be a baseline: a duration, rate or bandwidth
    whose every sample is 0 (see the module's docstring), or None."""
    family = UNIT_FAMILIES.get(unit) if isinstance(unit, str) else None
    values = list(values)
    if family in ZERO_MEASURES_NOTHING and values and all(v == 0 for v in values):
        return (f"every sample is 0 {unit}: {_WHAT[family]} of zero measured nothing, and no later run can be "
                f"judged against it")
    return None
