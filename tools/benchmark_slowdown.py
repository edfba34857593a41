"""A pytest plugin that makes every benchmarked call of a pytest-benchmark suite N times slower.

Why: to check that a gate catches a known slowdown in a suite nobody here wrote (issue 47,
docs/pytest-benchmark.md), without editing the suite. Load it with ``-p benchmark_slowdown`` (this
folder on PYTHONPATH) and set ``BENCHMARK_SLOWDOWN`` to the factor (1.0, 1.25, 2.0).

Each call of the target a test hands to ``benchmark(...)`` or ``benchmark.pedantic(...)`` is timed and
followed by a spin on the clock for ``(factor - 1)`` times its own duration, so the call takes factor x
its time whatever it does (a stateful target is not run twice). The wrapper is there at every factor,
1.0 included, so its own cost (two clock reads) is in the baseline too and the factor is the call's.
It wraps whatever object the test receives as ``benchmark`` (pytest-benchmark's fixture, or perfgate's
gated one), and leaves it wrapped for re-measurements inside the test's call phase; pytest-benchmark
gets its own fixture back before it reports.
"""
from __future__ import annotations

import os
import time

import pytest

ENV = "BENCHMARK_SLOWDOWN"


def _factor() -> float:
    value = float(os.environ.get(ENV, "1.0"))
    if not 1.0 <= value <= 100.0:
        raise pytest.UsageError(f"{ENV} must be a factor in [1, 100], got {value}")
    return value


def slowed(fn, factor: float):
    """``fn`` taking ``factor`` x its own time per call (a spin on perf_counter for the rest)."""
    def call(*args, **kwargs):
        start = time.perf_counter()
        result = fn(*args, **kwargs)
        end = start + factor * (time.perf_counter() - start)
        while time.perf_counter() < end:
            pass
        return result
    return call


class SlowedBenchmark:
    """What the test receives as ``benchmark``: the real one, with every target slowed."""

    def __init__(self, inner, factor: float):
        object.__setattr__(self, "_inner", inner)
        object.__setattr__(self, "_factor", factor)

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def __setattr__(self, name, value):
        setattr(self._inner, name, value)

    def __call__(self, fn, *args, **kwargs):
        return self._inner(slowed(fn, self._factor), *args, **kwargs)

    def pedantic(self, target, *args, **kwargs):
        return self._inner.pedantic(slowed(target, self._factor), *args, **kwargs)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    funcargs = getattr(item, "funcargs", None) or {}
    if "benchmark" in funcargs and not isinstance(funcargs["benchmark"], SlowedBenchmark):
        funcargs["benchmark"] = SlowedBenchmark(funcargs["benchmark"], _factor())
    return (yield)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_makereport(item, call):
    funcargs = getattr(item, "funcargs", None) or {}
    fixture = funcargs.get("benchmark")
    while isinstance(fixture, SlowedBenchmark):  # pytest-benchmark's report hook checks the fixture's type
        fixture = fixture._inner
        funcargs["benchmark"] = fixture
