"""The pytest plugin: options, markers, hardware gating, the `perf` fixture, verdicts, report.

Data flows one way: a test records samples through `perf`; after its body returns, the
plugin compares them with the baseline for this hardware id and fails the test on a
regression (re-measuring first, up to --perf-retries times). Results travel to the
xdist controller in report.user_properties, so tables, files and refreshes work the
same with and without -n.

Reliability (docs/reliability.md): bad input (a malformed baseline for this hardware id,
an expert file that is not GGUF, a bad option) stops the session before anything runs,
with one message naming the file and the fix; SIGTERM becomes an interrupt, so results
so far are saved and marked ``interrupted`` and no baseline is refreshed from a partial
run, and from the session's finish until perfgate's report (naming what a refresh wrote) is printed,
SIGINT and SIGTERM wait; long sweeps print a progress line with an estimate of the time left; a machine found
busy before the session (machine.preflight) or while a test measured (machine.load_watch)
labels the numbers tainted instead of gating them.
"""
from __future__ import annotations

import contextlib
import difflib
import re
import signal
import sys
import threading

import pytest

from perfgate import benchmark_bridge, node_ids
from perfgate.judge.config import ConfigError
from perfgate.judge.gate import evaluate
from perfgate.judge.policy import load_moves
from perfgate.judge.verdict import MIN_SAMPLES_TO_DECIDE, Outcome, fails
from perfgate.machine import hardware, suite_packages
from perfgate.machine.hardware_id import HardwareIdError
from perfgate.machine.markers import MARKERS, missing_requirements
from perfgate.recorder import PerfRecorder
from perfgate.report import outputs, run_report
from perfgate.report.textable import printable, resolve_width
from perfgate.runcache import RunCache
from perfgate.options import pytest_addoption  # noqa: F401 (a pytest hook: pytest finds it by name here)
from perfgate.session import WORKER_KEY, PerfState
from perfgate import interrupts
from perfgate.store.baselines import BaselineError
from perfgate.store.readers import ReadError
from perfgate.judge.metric_result import MetricResult
from perfgate.store.safe_paths import PathError
from perfgate.workloads.area import Case

_STATE = pytest.StashKey[PerfState]()
_PROP = "perfgate.store.results"
_ATTACH = "perfgate.attachments"
_PERF_TEST = "perfgate.perf_test"  # marks a test that uses the perf fixture, for the controller
_RESULTS = pytest.StashKey[list]()
_HOLD = pytest.StashKey[interrupts.Hold]()  # SIGINT/SIGTERM wait from the session's finish to its report
_TAINT = pytest.StashKey[list]()  # why this test's numbers were measured on a busy machine (load_watch)
_FOREIGN = pytest.StashKey[object]()  # cores others took while they were measured (float), or None


_PACKAGES = "perfgate.packages"  # what the suite's test modules import, for the controller's results file


def _fail(lines: list[str]):
    """Fail the test with these lines and nothing else: one per regression (its full reasoning is in the
    report), no traceback of perfgate's hooks (under ``-l`` that was ~90 lines before the one that matters)."""
    __tracebackhide__ = True
    pytest.fail("\n".join(printable(line) for line in lines), pytrace=False)


def _suite_packages(item: pytest.Item, state: PerfState) -> dict[str, str]:
    """The versions of what this session's test modules import (once per process, when first needed)."""
    if state.packages is None:
        modules = {id(m): m for i in item.session.items if (m := getattr(i, "module", None)) is not None}
        state.packages = suite_packages.packages_of(modules.values())
    return state.packages


def pytest_configure(config: pytest.Config) -> None:
    for name, doc in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {doc}")
    worker = hasattr(config, "workerinput")
    try:
        state = config.stash[_STATE] = PerfState(config)
    except (ConfigError, BaselineError, ReadError, HardwareIdError, PathError) as exc:
        raise pytest.UsageError(f"perfgate: {exc}") from None
    outputs.check_before_run(config, state)
    benchmark_bridge.register(config)
    if worker:
        handed = config.workerinput.get(WORKER_KEY) or {}
        node_ids.set_fallback(config, handed.get("id_root"))  # ids as the controller's (perfgate.node_ids)
        state.started_wall = handed.get("started_wall", state.started_wall)
        state.tainted = list(handed.get("tainted", []))
        return
    if state.policy.preflight(config.getoption("--perf-preflight"), lambda: hardware.gpu_count() > 0):
        from perfgate.machine import preflight

        state.tainted = list(preflight.taint_reasons())
    if threading.current_thread() is threading.main_thread():
        # SIGTERM (CI cancel, a scheduler's kill) becomes KeyboardInterrupt: pytest then runs
        # sessionfinish, so results so far are saved and no baseline is left half-written.
        def _term(signum, frame):
            raise KeyboardInterrupt(f"perfgate: received signal {signum}")
        with contextlib.suppress(ValueError):
            state.old_sigterm = signal.signal(signal.SIGTERM, _term)


def pytest_unconfigure(config: pytest.Config) -> None:
    _release_signals(config, lambda text: print(f"perfgate: {text}", file=sys.stderr))  # no terminal summary ran
    state = config.stash.get(_STATE, None)
    if state is not None and state.old_sigterm is not None and threading.current_thread() is threading.main_thread():
        with contextlib.suppress(ValueError, TypeError):
            signal.signal(signal.SIGTERM, state.old_sigterm)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    """xdist: workers count the budget from the controller's start and share its taint verdict."""
    state = node.config.stash[_STATE]
    node.workerinput[WORKER_KEY] = {"started_wall": state.started_wall, "tainted": state.tainted,
                                    "id_root": str(node_ids.fallback(node.config))}


_UNKNOWN_MARKER = re.compile(r"'([^']+)' not found in `markers` configuration option")


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector: pytest.Collector):
    """A typo'd marker fails collection (--strict-markers); add which markers exist and the fix."""
    rep = yield
    if rep.failed:
        m = _UNKNOWN_MARKER.search(str(rep.longrepr))
        if m:
            name = m.group(1)
            close = difflib.get_close_matches(name, list(MARKERS), n=2, cutoff=0.5)
            hint = (f"unknown marker {name!r} in {collector.nodeid or collector.path}"
                    + (f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ".")
                    + f"\nperfgate's markers: {', '.join(MARKERS)}."
                    + "\nFix the name, or register a marker of your own under [tool.pytest.ini_options] "
                      "markers in pyproject.toml.")
            rep.sections.append(("perfgate: unknown marker", hint))
    return rep


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    cache: dict[tuple, list[str]] = {}
    for item in items:
        names = frozenset(m.name for m in item.iter_markers() if m.name in MARKERS)
        need = max((float(m.args[0]) for m in item.iter_markers("gpu_memory") if m.args), default=None)
        if (names, need) not in cache:
            cache[names, need] = missing_requirements(set(names), need)
        if cache[names, need]:
            item.add_marker(pytest.mark.skip(reason="; ".join(cache[names, need])))


def pytest_runtest_setup(item: pytest.Item) -> None:
    state = item.config.stash[_STATE]
    if state.budget_s is not None and "perf" in getattr(item, "fixturenames", ()):
        spent = state.spent_s()
        if spent > state.budget_s:
            pytest.skip(f"perf budget of {state.budget_s / 60:g} min spent ({spent / 60:.1f} min elapsed)")


@pytest.fixture
def perf(request: pytest.FixtureRequest) -> PerfRecorder:
    """Record measurements: ``perf.record(name, samples, unit=..., better=...)``."""
    return PerfRecorder(node_ids.perf_test_id(request.node))


@pytest.fixture(scope="session")
def runs(request: pytest.FixtureRequest) -> RunCache:
    """The session's cache of workload results: ``runs.get(key, produce)`` (perfgate.runcache).
    A re-measurement drops the entries the re-measured test read, so it gets fresh samples."""
    return request.config.stash[_STATE].runs


def _busiest(*taken: float | None) -> float | None:
    """The most CPU others took in any of the windows that measured a test (None: none was judged)."""
    return max((t for t in taken if t is not None), default=None)


def _evaluate(state: PerfState, rec: PerfRecorder, pooled: bool, watched: list[str],
              foreign_cores: float | None = None) -> list[MetricResult]:
    """``watched``: why the machine was busy while this test measured (load_watch), beside the preflight's;
    ``foreign_cores``: how busy (the cores others took in the busiest window), for the load bound."""
    tainted = state.tainted + [r for r in watched if r not in state.tainted]
    out = []
    context = state.context(tainted, foreign_cores)
    for name, metric in rec.metrics.items():
        choice = state.chooser.choose(rec.test_id, name, dependency=metric.dependency)
        r = evaluate(rec.test_id, metric, choice, context, samples=rec.pooled(name) if pooled else None,
                     attempts=len(rec.attempts), workload=rec.workload)
        if state.allow_tainted and tainted and load_moves(metric.dependency):
            r.tainted = list(tainted)  # gated as asked, still labelled (and kept out of refreshes)
        out.append(r)
    return out


def _suspect(r: MetricResult) -> bool:
    return r.gated and r.outcome in (Outcome.REGRESSION.value, Outcome.NOISY.value)


# The samples a metric measured once a run is re-measured to, when it is a suspect or has no baseline yet:
# twice the fewest that can reach significance (MIN_SAMPLES_TO_DECIDE), so that one disturbed round on either
# side is outvoted (a 0.2 ms round preempted to 28 ms in a 5-round baseline left a 2x slowdown at p = 0.075
# against 5 rounds, 0.038 against 10), at most this many re-measurements of one test.
REMEASURED_SAMPLES = 2 * MIN_SAMPLES_TO_DECIDE
MAX_REMEASURES_FOR_SAMPLES = REMEASURED_SAMPLES - 1


def _too_few(r: MetricResult, rec: PerfRecorder) -> bool:
    """A noisy suspect with few samples over every attempt so far (one a run: pytest-benchmark's pedantic
    rounds=1) is re-measured until it has REMEASURED_SAMPLES, whatever --perf-retries says: one sample can
    only ever be ``noisy`` and never fail (issue 47); it stops as soon as its pooled verdict is not noisy."""
    return (r.gated and r.outcome == Outcome.NOISY.value and r.metric in rec.metrics
            and len(rec.pooled(r.metric)) < REMEASURED_SAMPLES)


def _thin_reference(r: MetricResult, rec: PerfRecorder, item: pytest.Item) -> bool:
    """A pytest-benchmark test with no baseline yet that timed fewer rounds than REMEASURED_SAMPLES is re-run
    until it has them: the baseline it may become is then a median of 10, not one round taken on whatever
    the machine did at that moment (a 2 ms pedantic round read 25 ms on a busy 2-core VM). A perf test
    chooses its own samples (a served model started once), so this is for benchmark tests only."""
    return (r.outcome == Outcome.NEW.value and rec is benchmark_bridge.recorder_of(item) and r.metric in rec.metrics
            and len(rec.pooled(r.metric)) < REMEASURED_SAMPLES)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    state = item.config.stash[_STATE]
    state.runs.begin(item.nodeid)
    try:
        return (yield from _judge(item, state))
    finally:
        state.runs.begin(None)


def _recorder(item: pytest.Item) -> PerfRecorder | None:
    """The test's ``perf`` fixture, or the recorder a pytest-benchmark ``benchmark`` test recorded into."""
    rec = getattr(item, "funcargs", {}).get("perf")
    return rec if isinstance(rec, PerfRecorder) else benchmark_bridge.recorder_of(item)


def _judge(item: pytest.Item, state: PerfState):
    __tracebackhide__ = True
    if _recorder(item) is None and "perf" not in getattr(item, "fixturenames", ()):
        return (yield)
    try:  # taint: the machine was busy in this call's own window, or in the launches it read (runcache)
        with state.watch.window() as window:
            result = yield
    finally:  # also when the body failed after recording: makereport judges what it kept
        item.stash[_TAINT] = window.reasons + state.runs.taint_of(item.nodeid)
        item.stash[_FOREIGN] = _busiest(window.foreign_cores, state.runs.foreign_cores_of(item.nodeid))
    rec = _recorder(item)
    if not isinstance(rec, PerfRecorder) or not rec.metrics:
        return result
    try:
        watched, foreign = item.stash[_TAINT], item.stash[_FOREIGN]
        evaluated = _evaluate(state, rec, pooled=False, watched=watched, foreign_cores=foreign)
        attempt, pool = 0, False
        while (any(_suspect(r) for r in evaluated) and (
                attempt < state.settings.retries
                or (attempt < MAX_REMEASURES_FOR_SAMPLES and any(_too_few(r, rec) for r in evaluated)))
               or (attempt < MAX_REMEASURES_FOR_SAMPLES and any(_thin_reference(r, rec, item) for r in evaluated))):
            attempt += 1
            # a metric of too few samples a run is judged on all its attempts from here on: one lucky round
            # must not pass what 5 rounds would fail
            pool = pool or any(_too_few(r, rec) or _thin_reference(r, rec, item) for r in evaluated)
            rec.new_attempt()
            state.runs.invalidate(item.nodeid)  # the re-run measures afresh what this test read
            with state.watch.window() as window:
                item.runtest()  # re-measure: the same test body, a fresh set of samples
            again = window.reasons + state.runs.taint_of(item.nodeid)
            busy_again = _busiest(window.foreign_cores, state.runs.foreign_cores_of(item.nodeid))
            watched = watched + [r for r in again if r not in watched]
            foreign = _busiest(foreign, busy_again)
            evaluated = _evaluate(state, rec, pooled=pool, watched=watched if pool else again,
                                  foreign_cores=foreign if pool else busy_again)
        if len(rec.attempts) > 1 and not pool and any(_suspect(r) or r.outcome == Outcome.NEW.value
                                                      for r in evaluated):
            # every attempt's samples: for the verdict, or for the baseline a new metric may become
            evaluated = _evaluate(state, rec, pooled=True, watched=watched, foreign_cores=foreign)
    except (BaselineError, ValueError) as exc:
        _fail([f"perfgate could not compare: {exc}"])
    item.stash[_RESULTS] = evaluated
    failing = [r for r in evaluated if r.gated and fails(Outcome(r.outcome), strict=state.strict)]
    if failing:
        _suite_packages(item, state)
        _fail([f"perfgate: performance regression: {run_report.regression_line(r, state.software())}"
               for r in failing])
    return result



@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    rep = yield
    if call.when == "call":
        evaluated = item.stash.get(_RESULTS, None)
        rec = _recorder(item)
        if evaluated is None and isinstance(rec, PerfRecorder) and rec.metrics:
            # The test body failed after recording: keep what it measured, marked unjudged.
            state = item.config.stash[_STATE]
            try:
                evaluated = _evaluate(state, rec, pooled=False, watched=item.stash.get(_TAINT, []),
                                      foreign_cores=item.stash.get(_FOREIGN, None))
            except (BaselineError, ValueError):
                evaluated = None
        if evaluated:
            rep.user_properties.append((_PROP, [r.to_dict() for r in evaluated]))
            rep.user_properties.append((_PACKAGES, _suite_packages(item, item.config.stash[_STATE])))
        if isinstance(rec, PerfRecorder) and rec.attachments:
            rep.user_properties.append((_ATTACH, rec.attachments))
    elif call.when == "teardown" and "perf" in getattr(item, "fixturenames", ()):
        rep.user_properties.append((_PERF_TEST, True))
    return rep


def _collect(config: pytest.Config, report) -> None:
    state = config.stash[_STATE]
    if report.when == "teardown":
        state.progress.finished(report.nodeid)
        if any(key == _PERF_TEST for key, _ in report.user_properties):
            state.progress.has_perf_tests = True
        _maybe_print_progress(config, state)
    for key, value in report.user_properties:
        if key == _PROP:
            state.results.extend(MetricResult.from_dict(d) for d in value)
        elif key == _ATTACH:
            state.attachments[report.nodeid] = value
        elif key == _PACKAGES:
            state.packages = {**(state.packages or {}), **value}
    if report.when == "setup" and report.skipped and state.budget_s is not None:
        reason = str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else str(report.longrepr)
        if "perf budget" in reason:
            state.skipped_by_budget.append(report.nodeid)


def _maybe_print_progress(config: pytest.Config, state: PerfState) -> None:
    interval = config.getoption("--perf-progress")
    if interval is None or config.get_verbosity() < -1 or not state.progress.due(interval):
        return
    tr = config.pluginmanager.get_plugin("terminalreporter")
    if tr is None:
        return
    if tr._tw.width_of_current_line:  # after a row of dots (-q): start a new line
        tr._tw.line()
    tr.write_line(state.progress.line(color=tr.hasmarkup))
    tr.currentfspath = None  # the next result starts a fresh line with its file name


class _Collector:
    """Controller-side hooks: results from every test (and xdist worker), and sweep progress."""

    def __init__(self, config: pytest.Config):
        self.config = config

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report):
        _collect(self.config, report)

    @pytest.hookimpl
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.config.stash[_STATE].runs.selected_cases = tuple(
            item.callspec.params["case"].values for item in session.items
            if isinstance(getattr(getattr(item, "callspec", None), "params", {}).get("case"), Case)
            and item.get_closest_marker("skip") is None)  # a skipped test reads nothing
        if not hasattr(self.config, "workerinput") and session.items:
            self.config.stash[_STATE].progress.start(len(session.items))

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node, ids) -> None:
        self.config.stash[_STATE].progress.start(len(ids))


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    if not hasattr(session.config, "workerinput"):
        session.config.pluginmanager.register(_Collector(session.config), "perfgate-collector")


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    if hasattr(config, "workerinput"):
        return
    # From here until perfgate's report is printed, SIGINT/SIGTERM wait (_release_signals): whoever writes
    # a committed baseline must say so, and a Ctrl-C landing in another plugin's hook stopped the report.
    config.stash[_HOLD] = interrupts.Hold().start()
    state = config.stash[_STATE]
    # Ctrl-C, SIGTERM (turned into KeyboardInterrupt above) or an xdist shutdown: a partial run.
    state.interrupted = state.interrupted or exitstatus == pytest.ExitCode.INTERRUPTED
    if not state.results and not state.skipped_by_budget:
        if config.getoption("--perf-refresh") and not state.interrupted:
            state.refresh_note = "perfgate: --perf-refresh wrote nothing: " + (
                "no test that uses the perf fixture produced a result (see the failures above)"
                if state.progress.has_perf_tests else f"none of the {session.testscollected} selected test(s) uses "
                f"the perf fixture; select perf tests (e.g. -m cpu perf/)")
            state.refresh_failed = True
            _refresh_failed(session)
        return
    outputs.write_outputs(config, state)
    if state.refresh_failed:
        _refresh_failed(session)


def _refresh_failed(session: pytest.Session) -> None:
    """A refresh that wrote nothing must not look like a green run in CI."""
    if session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


_MARKUP = {"regression": {"red": True, "bold": True}, "noisy": {"yellow": True}, "improved": {"cyan": True},
           "new": {"blue": True}, "verdict": {"green": True, "bold": True}, "note": {"yellow": True}}


def _judged_with(settings, hardware_id: str) -> str:
    """Where the baselines are, and whose tolerances.toml judged them where it is another id's."""
    where = str(settings.baselines / hardware_id)
    borrowed = settings.tolerances_id  # another id only where that id has the file (baseline_choice.tolerances_id)
    if borrowed and borrowed != hardware_id:
        where += (f"; tolerances from {settings.baselines / borrowed / 'tolerances.toml'} "
                  f"({hardware_id} has no tolerances.toml of its own)")
    return where


def _release_signals(config: pytest.Config, say) -> None:
    """End the hold that pytest_sessionfinish started; say which signals waited for the results."""
    hold = config.stash.get(_HOLD, None)
    if hold is None or not hold.holding:
        return
    held = hold.release()
    if held:
        names = ", ".join(sorted({signal.Signals(s).name for s in held}))
        say(f"{names} arrived while results were being written and reported; they were completed first")


@pytest.hookimpl(tryfirst=True)  # first of the plugins' summaries: no other plugin's runs while signals wait
def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):
        return
    try:
        _summary(terminalreporter, config)
    finally:
        _release_signals(config, terminalreporter.write_line)


def _summary(terminalreporter, config: pytest.Config) -> None:
    state = config.stash[_STATE]
    if not state.results and not state.skipped_by_budget:
        if state.refresh_note:
            terminalreporter.section("perfgate")
            terminalreporter.write_line(state.refresh_note, red=True)
        return
    tr = terminalreporter
    tr.section("perfgate")
    lines = run_report.terminal_lines(state.results, hardware_id=state.hardware_id,
                                  width=resolve_width(isatty=bool(tr.isatty()), tty_width=tr._tw.fullwidth),
                                  table=config.getoption("--perf-table"), notes=outputs.report_notes(state),
                                  full_table_at=config.getoption("--perf-markdown"),
                                  current_software=state.software(),
                                  baselines_at=_judged_with(state.settings, state.hardware_id))
    for line in lines:
        tr.write_line(line.text, **_MARKUP.get(line.style, {}))
    new = [r for r in state.results if r.outcome == "new"]
    if new:
        tr.write_line(f"{len(new)} metric(s) have no baseline for {state.hardware_id}: record them with "
                      f"`pytest --perf-refresh ...` or `perfgate refresh RESULTS.json`")
    if state.skipped_by_budget:
        tr.write_line(f"perf budget spent: {len(state.skipped_by_budget)} test(s) not run: "
                      + printable(", ".join(state.skipped_by_budget)))
    if state.refresh_note:
        tr.write_line(state.refresh_note, red=state.refresh_failed)
    if state.save_note:
        tr.write_line(state.save_note)
