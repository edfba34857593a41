"""pytest-benchmark's ``benchmark`` fixture, gated by perfgate: one metric per benchmark test.

A test written the pytest-benchmark way (``def test_sort(benchmark): benchmark(sorted, data)``
or ``benchmark.pedantic(...)``) gets the metric ``time_s``: the raw per-iteration round
timings as samples, unit ``s``, lower is better, compared with this hardware id's baseline
like any ``perf.record`` metric (same table, results file, verdicts, retries, refresh).
pytest-benchmark keeps doing its own job (its table, ``--benchmark-json``, ``--benchmark-compare``).

How: during the test body the fixture object the test receives is a thin wrapper
(:class:`GatedBenchmark`) around pytest-benchmark's own, which delegates every call and
attribute and, after the real fixture returns, reads its public ``stats`` (the Metadata of
the run: ``stats.stats.data`` per-iteration seconds, ``stats.iterations``). No private
attribute of pytest-benchmark is read or written; pytest-benchmark offers no per-test hook
(``pytest_benchmark_update_json`` runs once at session end, too late to fail a test), and
its fixture cannot be overridden from another plugin reliably, hence the wrapper.
Tested against pytest-benchmark 5.x (tests/test_benchmark_bridge.py); pyproject.toml pins <6.

perfgate times the callable itself (perf_counter, pytest-benchmark's round rules) when
pytest-benchmark switched itself off (under xdist) and when perfgate re-measures a
suspected regression (pytest-benchmark's fixture can run once per test). An explicit
``--benchmark-disable`` is respected: nothing is timed or recorded.

On ``cpu-*`` hardware ids ``time_s`` is absolute, so by the gating policy (judge/gate.py)
it is recorded and shown but not gated: a shared CI runner scatters wall times by more than
any useful tolerance. Gate it with ``--perf-gate all`` (or ``[tool.perfgate] gate = "all"``)
on a quiet, dedicated machine; on GPU hardware ids it is gated by default.
"""
from __future__ import annotations

import math
import os
import time
from typing import Any, Callable

import pytest

from perfgate.node_ids import perf_test_id
from perfgate.recorder import PerfRecorder
from perfgate.workloads import timing

METRIC = "time_s"
RECORDER = pytest.StashKey[PerfRecorder]()
_SELF_TIMED = "perfgate.benchmark_self_timed"  # user property: this test was timed by perfgate under xdist
_SELF_TIMED_KEY = pytest.StashKey[bool]()
_MAX_ROUNDS = 100_000
# perf_counter's resolution, the clock pytest-benchmark and perfgate time with (1 ns on Linux)
TIMER_RESOLUTION_S = time.get_clock_info("perf_counter").resolution


def recorder_of(item: pytest.Item) -> PerfRecorder | None:
    """The recorder a benchmark test recorded into (when it does not use ``perf`` itself)."""
    return item.stash.get(RECORDER, None)


def register(config: pytest.Config) -> None:
    """Called from perfgate's pytest_configure: active only where pytest-benchmark is."""
    if config.pluginmanager.hasplugin("benchmark") and not config.pluginmanager.hasplugin("perfgate-benchmark"):
        config.pluginmanager.register(_Bridge(config), "perfgate-benchmark")


def _self_timer_settings(config: pytest.Config, item: pytest.Item) -> dict[str, float]:
    """pytest-benchmark's own options (and @pytest.mark.benchmark overrides) for perfgate's timer."""
    opts = {"min_rounds": int(config.getoption("benchmark_min_rounds")),
            "max_time": float(config.getoption("benchmark_max_time")),
            "min_time": float(config.getoption("benchmark_min_time"))}
    marker = item.get_closest_marker("benchmark")
    for key in opts:
        if marker is not None and key in marker.kwargs:
            opts[key] = type(opts[key])(marker.kwargs[key])
    return opts


def time_rounds(call: Callable[[], Any], *, rounds: int, iterations: int, warmup_rounds: int = 0,
                setup: Callable[[], Any] | None = None, teardown: Callable[..., Any] | None = None) -> list[float]:
    """Per-iteration seconds of ``rounds`` rounds of ``iterations`` calls, as pytest-benchmark's runner
    measures them (``setup`` before each round, untimed; its return value, if any, is ``(args, kwargs)``)."""
    out = []
    for r in range(warmup_rounds + rounds):
        args, kwargs = (), {}
        if setup is not None:
            made = setup()
            if made:
                args, kwargs = made
        span = timing.Span(timing.HOST)
        for _ in range(iterations):
            call(*args, **kwargs)
        elapsed = span.close().seconds()
        if teardown is not None:
            teardown(*args, **kwargs)
        if r >= warmup_rounds:
            out.append(elapsed / iterations)
    return out


def calibrated_rounds(call: Callable[[], Any], *, min_rounds: int, max_time: float,
                      min_time: float) -> tuple[int, int]:
    """(rounds, iterations) by pytest-benchmark's rule: enough iterations that a round lasts
    ``min_time`` (and 100 us, well above perf_counter's resolution), rounds to fill ``max_time``."""
    target = max(min_time, 1e-4)
    iterations = 1
    while True:
        span = timing.Span(timing.HOST)
        for _ in range(iterations):
            call()
        duration = span.close().seconds()
        if duration >= target or iterations >= 10**7:
            break
        iterations *= 10
    rounds = max(min_rounds, min(_MAX_ROUNDS, math.ceil(max_time / max(duration, 1e-9))))
    return rounds, iterations


class GatedBenchmark:
    """What a benchmark test receives as ``benchmark``: pytest-benchmark's fixture, plus a
    ``time_s`` metric recorded into the test's perfgate recorder after each use."""

    def __init__(self, fixture, recorder: PerfRecorder, config: pytest.Config, item: pytest.Item):
        for name, value in (("_fixture", fixture), ("_recorder", recorder), ("_config", config), ("_item", item),
                            ("_used", False)):
            object.__setattr__(self, name, value)

    def __getattr__(self, name):
        return getattr(self._fixture, name)

    def __setattr__(self, name, value):  # benchmark.group = ..., benchmark.extra_info = ...
        setattr(self._fixture, name, value)

    def _timer(self) -> str:
        """'pytest-benchmark': its calibrated run does the timing; 'perfgate': we time (pytest-benchmark
        is off under xdist, or its fixture is used up and perfgate re-measures); 'off': the user
        disabled benchmarks (--benchmark-disable) and nothing is recorded."""
        if self._fixture.disabled:
            opt = self._config.getoption
            return "off" if opt("benchmark_disable") and not opt("benchmark_enable") else "perfgate"
        return "perfgate" if self._used else "pytest-benchmark"

    def __call__(self, fn, *args, **kwargs):
        timer = self._timer()
        if timer == "pytest-benchmark":
            return self._first_use(lambda: self._fixture(fn, *args, **kwargs))
        if timer == "perfgate":
            call = lambda: fn(*args, **kwargs)  # noqa: E731
            stats = self._fixture.stats
            if stats is not None and stats.stats.data:  # a re-measurement: the first attempt's rounds and iterations
                rounds, iterations = len(stats.stats.data), stats.iterations
            else:
                rounds, iterations = calibrated_rounds(call, **_self_timer_settings(self._config, self._item))
            self._record(time_rounds(call, rounds=rounds, iterations=iterations, warmup_rounds=1), iterations)
        if self._used:
            return fn(*args, **kwargs)
        return self._first_use(lambda: self._fixture(fn, *args, **kwargs), record=False)

    def pedantic(self, target, args=(), kwargs=None, setup=None, teardown=None, rounds=1, warmup_rounds=0,
                 iterations=1):
        real = lambda: self._fixture.pedantic(  # noqa: E731
            target, args=args, kwargs=kwargs, setup=setup, teardown=teardown, rounds=rounds,
            warmup_rounds=warmup_rounds, iterations=iterations)
        timer = self._timer()
        if timer == "pytest-benchmark":
            return self._first_use(real)
        if timer == "perfgate":
            make = setup or (lambda: (args, kwargs or {}))
            self._record(time_rounds(target, rounds=rounds, iterations=iterations, warmup_rounds=warmup_rounds,
                                     setup=make, teardown=teardown), iterations)
            if self._used:  # pytest-benchmark's fixture runs once per test: the result from a plain call
                made_args, made_kwargs = make() or (args, kwargs or {})
                result = target(*made_args, **made_kwargs)
                if teardown is not None:
                    teardown(*made_args, **made_kwargs)
                return result
        return self._first_use(real, record=False)

    def _first_use(self, run: Callable[[], Any], *, record: bool = True):
        """pytest-benchmark's own call (it raises if the test uses the fixture twice, as without perfgate)."""
        result = run()
        object.__setattr__(self, "_used", True)
        if record:
            stats = self._fixture.stats
            self._record(list(stats.stats.data), stats.iterations, self_timed=False)
        return result

    def _record(self, samples: list[float], iterations: int, *, self_timed: bool = True) -> None:
        """Every round's per-iteration time; the floor is the timer's resolution over the iterations of a
        round: a mean over many calls resolves far below any fixed floor (a 0.5 us call made 2x slower
        moved 0.5 us and passed the 2 us default, issue 47), and the verdict names the floor it used."""
        if self_timed and self._fixture.disabled:
            self._item.stash[_SELF_TIMED_KEY] = True
        floor = TIMER_RESOLUTION_S / max(1, int(iterations))
        self._recorder.record(METRIC, samples, unit="s", better="lower", floor=floor)


class _Bridge:
    """The hooks; registered only where pytest-benchmark is active."""

    def __init__(self, config: pytest.Config):
        self.config = config
        self.self_timed: list[str] = []
        self.workers = 1  # the most xdist workers that timed benchmarks at once

    @pytest.hookimpl(wrapper=True, tryfirst=True)  # outermost: perfgate's judge (and its re-runs) inside
    def pytest_runtest_call(self, item: pytest.Item):
        __tracebackhide__ = True  # a failure shows the test's frames and perfgate's one line, not this hook
        funcargs = getattr(item, "funcargs", None)
        fixture = funcargs.get("benchmark") if funcargs else None
        if fixture is None or not hasattr(fixture, "pedantic") or isinstance(fixture, GatedBenchmark):
            return (yield)
        rec = funcargs.get("perf")
        if not isinstance(rec, PerfRecorder):
            rec = item.stash[RECORDER] = PerfRecorder(perf_test_id(item))
        funcargs["benchmark"] = GatedBenchmark(fixture, rec, self.config, item)
        try:
            return (yield)
        finally:
            funcargs["benchmark"] = fixture  # pytest-benchmark's report hook checks the type

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call):
        rep = yield
        if call.when == "call" and item.stash.get(_SELF_TIMED_KEY, False):
            workers = getattr(self.config, "workerinput", {}).get("workercount", 1)
            rep.user_properties.append((_SELF_TIMED, workers))
        return rep

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report) -> None:
        if not hasattr(self.config, "workerinput"):
            for key, workers in report.user_properties:
                if key == _SELF_TIMED:
                    self.self_timed.append(report.nodeid)
                    self.workers = max(self.workers, int(workers) if isinstance(workers, int) else 1)

    @pytest.hookimpl(trylast=True)
    def pytest_terminal_summary(self, terminalreporter) -> None:
        if self.self_timed and not hasattr(self.config, "workerinput"):
            terminalreporter.write_line(
                f"perfgate: pytest-benchmark is off under xdist; perfgate timed {len(self.self_timed)} benchmark "
                f"test(s) itself (perf_counter, pytest-benchmark's round rules) for their {METRIC} metric")
            if self.workers > 1:
                terminalreporter.write_line(concurrency_note(self.workers, os.cpu_count() or 1), yellow=True)


def concurrency_note(workers: int, cores: int) -> str:
    """The line a run timed by several xdist workers at once gets: they share the machine's cores, so
    each timing carries its neighbours' work (two workers on two cores read a sort up to +51 % above a
    serial run, tests/test_benchmark_bridge.py), and it is judged like any other."""
    share = "more workers than" if workers > cores else "as many workers as" if workers == cores else "on"
    return (f"perfgate: benchmarks were timed concurrently: {workers} xdist workers at once, {share} {cores} CPU "
            f"core(s); each timing includes its neighbours' load. Compare only with baselines measured the same "
            f"way (-n {workers}), or time benchmarks without -n")
