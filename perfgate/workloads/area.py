"""What every workload package exposes to the perf tests: one :class:`Area`.

An area (``perfgate.workloads.<area>``) owns, for one kind of measurement:

* ``profiles``: the sizes and settings per machine class (``"cpu"``, ``"gpu"``), as data;
* ``cases(profile)``: the list of :class:`Case` the tests are parametrized with (id, values,
  the markers that select the hardware, the group of cases that share one launch);
* ``reduce(per_rank, ...)``: the one place where the raw per-rank samples that workers return
  are combined into the numbers a test records (slowest rank per step, sums of wrong
  elements, largest memory peak...).

A perf test then reads as one record's walk: ``runs.get`` (the plugin's cache) -> the
area's measure function (launch workers, ``reduce``) -> ``perf.record``. Nothing here imports
pytest; fixtures/cases.py turns a Case into a ``pytest.param``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

# Timed samples (steps, iterations) every worker measures at least: fewer make a rank test
# between baseline and current samples powerless, so specs refuse them before any rank starts.
MIN_MEASURED_STEPS = 5


@dataclass(frozen=True)
class Case:
    """One parametrization of a perf test, without pytest: ``values`` are the test's arguments."""

    id: str
    values: tuple
    marks: tuple[str, ...]          # marker names that select the hardware: "cpu", "2gpu", "nvlink"
    group: str | None = None        # cases measured by one launch (an xdist_group: same worker)
    skip: str | None = None         # a reason to skip this case on every machine


@dataclass(frozen=True)
class Area:
    name: str
    profiles: Mapping[str, Any]
    cases: Callable[..., list[Case]]
    reduce: Callable[..., Any]
    doc: str = field(default="", compare=False)

    def all_cases(self) -> list[Case]:
        """Cases of every profile, in profile order (CPU first): what a test module parametrizes."""
        return [c for profile in self.profiles.values() for c in self.cases(profile)]
