"""Typed metrics: a name, a unit, a direction, and repeated samples summarised robustly.

Medians and MAD rather than means and standard deviations: one descheduled iteration
on a shared CI machine must not move the number we gate on.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Iterable, Sequence

import numpy as np

MAX_STORED_SAMPLES = 200
# No measurement in any unit here comes near 1e30 (1e30 ns is 3e13 years; 1e30 B, a million
# yottabytes): a value beyond it is a failed measurement or a crafted file, and refusing it keeps
# every sum, mean and median of real values far from float overflow (a mean of [1e308, 1e308] is inf).
MAX_MAGNITUDE = 1e30
# A tolerance (relative, or absolute for fractions) above 10 (1000 %) lets any change pass: such a
# number in a file is damage or an attack, not a choice (a metric that noisy belongs in record_only).
MAX_TOLERANCE = 10.0

# Unit -> family. The family picks the default tolerance and whether the metric is a
# ratio measured inside one run (gated everywhere) or an absolute figure (gated on GPU ids).
UNIT_FAMILIES: dict[str, str] = {
    "GB/s": "bandwidth", "MB/s": "bandwidth", "GiB/s": "bandwidth", "Gbit/s": "bandwidth",
    "tok/s": "throughput", "req/s": "throughput", "samples/s": "throughput", "IOPS": "throughput",
    "it/s": "throughput",
    "ns": "latency", "us": "latency", "ms": "latency", "s": "latency",
    "B": "memory", "KiB": "memory", "MiB": "memory", "GiB": "memory", "MB": "memory", "GB": "memory",
    "x": "ratio",
    "fraction": "fraction",
    "count": "count",
}
RATIO_FAMILIES = frozenset({"ratio", "fraction"})
DIRECTIONS = ("higher", "lower")


class MetricError(ValueError):
    """A metric was recorded with an unknown unit, bad direction or unusable samples."""


def unit_family(unit: str) -> str:
    try:
        return UNIT_FAMILIES[unit]
    except (KeyError, TypeError):  # TypeError: an unhashable unit such as ["ms"]
        raise MetricError(f"unknown unit {unit!r}; known units: {', '.join(sorted(UNIT_FAMILIES))}") from None


@dataclass(frozen=True)
class Summary:
    median: float
    mad: float
    iqr: float
    min: float
    max: float
    mean: float
    n: int
    samples: tuple[float, ...]

    def to_dict(self) -> dict:
        d = asdict(self)
        d["samples"] = list(self.samples)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Summary":
        samples = tuple(float(x) for x in d.get("samples") or ())
        if not samples:
            samples = (float(d["median"]),)
        return cls(median=float(d["median"]), mad=float(d.get("mad", 0.0)), iqr=float(d.get("iqr", 0.0)),
                   min=float(d.get("min", d["median"])), max=float(d.get("max", d["median"])),
                   mean=float(d.get("mean", d["median"])), n=int(d.get("n", len(samples))), samples=samples)


def sample_value(x: object) -> float:
    """One measurement as a float: a real number (numpy scalars and 0-d tensors included), finite and
    of sane magnitude. A boolean, a string or None is a bug in the test, not a measurement."""
    if isinstance(x, (bool, np.bool_, str, bytes)) or x is None:
        raise MetricError(f"sample {x!r} is not a number: record measured values (floats or ints)")
    try:
        value = float(x)
    except (TypeError, ValueError, OverflowError):
        raise MetricError(f"sample {str(x)[:40]!r} is not a number: record measured values (floats or ints)") \
            from None
    if not math.isfinite(value):
        raise MetricError(f"non-finite sample {value}: a measurement failed upstream")
    if abs(value) > MAX_MAGNITUDE:
        raise MetricError(f"sample {value:g} beyond any real measurement (|x| <= {MAX_MAGNITUDE:g}): "
                          f"a measurement failed upstream, or the unit is wrong")
    return value


def summarize(samples: Iterable[float]) -> Summary:
    """Median, MAD, IQR, min, max, mean of finite samples of sane magnitude (so none of them overflows)."""
    try:
        if isinstance(samples, (str, bytes, dict)):
            raise TypeError
        values = [sample_value(x) for x in samples]
    except TypeError:  # not iterable
        raise MetricError(f"samples must be a list of numbers, got {str(samples)[:40]!r}") from None
    if not values:
        raise MetricError("no samples: a metric needs at least one measurement")
    arr = np.asarray(values)
    med = float(np.median(arr))
    q1, q3 = np.percentile(arr, [25, 75])
    summary = Summary(median=med, mad=float(np.median(np.abs(arr - med))), iqr=float(q3 - q1),
                      min=float(arr.min()), max=float(arr.max()), mean=float(arr.mean()), n=len(values),
                      samples=tuple(values[:MAX_STORED_SAMPLES]))
    if not all(math.isfinite(v) for v in (summary.median, summary.mad, summary.iqr, summary.mean)):
        raise MetricError(f"the summary of {len(values)} samples is not finite: a measurement failed upstream")
    return summary


@dataclass(frozen=True)
class Metric:
    """One recorded metric of one test: what a baseline entry and a result entry describe."""

    name: str
    unit: str
    better: str
    summary: Summary
    tol: float | None = None  # per-record override; None means "from config"

    def __post_init__(self):
        if self.better not in DIRECTIONS:
            raise MetricError(f"metric {self.name!r}: better must be 'higher' or 'lower', got {self.better!r}")
        unit_family(self.unit)
        if self.tol is None:
            return
        if isinstance(self.tol, bool) or not isinstance(self.tol, (int, float)) or not 0 <= self.tol:  # NaN too
            raise MetricError(f"metric {self.name!r}: tol must be a non-negative number, got {self.tol!r}")
        if self.tol > MAX_TOLERANCE:
            raise MetricError(f"metric {self.name!r}: tol must be at most {MAX_TOLERANCE:g} ({MAX_TOLERANCE:.0%}: "
                              f"0.05 is 5 %), got {self.tol!r}")

    @property
    def family(self) -> str:
        return unit_family(self.unit)

    @property
    def is_ratio(self) -> bool:
        return self.family in RATIO_FAMILIES


def paired_ratio(numerator: Sequence[float], denominator: Sequence[float], *,
                 truncate: bool = False) -> list[float]:
    """Per-sample ratios ``a[i] / b[i]`` of two sample lists measured side by side (step i of one
    case with step i of the other), so the ratio's spread carries the noise of both.

    Lists of different length are an error (a lost step would shift every pair) unless
    ``truncate``, which pairs up to the shorter list (runs of different step counts).
    """
    if len(numerator) != len(denominator) and not truncate:
        raise MetricError(f"cannot pair {len(numerator)} samples with {len(denominator)}")
    n = min(len(numerator), len(denominator))
    if any(b == 0 for b in denominator[:n]):
        raise MetricError("zero in the denominator samples: a measurement failed upstream")
    return [numerator[i] / denominator[i] for i in range(n)]


def paired_saving(new: Sequence[float], old: Sequence[float], *, truncate: bool = False) -> list[float]:
    """Per-sample fraction saved, ``1 - new[i] / old[i]`` (memory of a mode against its reference)."""
    return [1.0 - r for r in paired_ratio(new, old, truncate=truncate)]
