"""The pytest plugin: options, markers, hardware gating, the `perf` fixture, verdicts, report.

Data flows one way: a test records samples through `perf`; after its body returns, the
plugin compares them with the baseline for this hardware id and fails the test on a
regression (re-measuring first, up to --perf-retries times). Results travel to the
xdist controller in report.user_properties, so tables, files and refreshes work the
same with and without -n.
"""
from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from perfgate import hardware, report, results as results_mod
from perfgate.baselines import BaselineError, BaselineStore
from perfgate.config import GATE_MODES, ConfigError, load_settings
from perfgate.gate import evaluate
from perfgate.markers import MARKERS, missing_requirements
from perfgate.recorder import PerfRecorder
from perfgate.results import MetricResult, area_of
from perfgate.verdict import Outcome, fails

_STATE = pytest.StashKey["_PerfState"]()
_PROP = "perfgate.results"
_ATTACH = "perfgate.attachments"
_RESULTS = pytest.StashKey[list]()


class PerfRegression(AssertionError):
    """Raised into a test whose gated metric regressed; pytest shows it as the failure."""


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("perfgate", "performance regression gates")
    g.addoption("--perf-baselines", metavar="DIR", help="baseline folder (default: [tool.perfgate] baselines)")
    g.addoption("--perf-save", metavar="PATH", help="write this run's results as JSON")
    g.addoption("--perf-refresh", action="store_true",
                help="write this run's results as baselines for the current hardware id")
    g.addoption("--perf-retries", type=int, metavar="N", help="re-measure a suspected regression up to N times")
    g.addoption("--perf-strict", action="store_true", help="fail on 'noisy' verdicts too")
    g.addoption("--perf-markdown", metavar="PATH", help="write a Markdown summary (for CI job summaries)")
    g.addoption("--perf-gate", choices=GATE_MODES,
                help="which metrics can fail a test: auto (ratios; absolute ones on GPU ids), all, ratios")
    g.addoption("--perf-hardware-id", metavar="ID", help="override the detected hardware id")
    g.addoption("--perf-history", metavar="DIR", help="also append this run's results to DIR (one JSON per run)")
    g.addoption("--perf-budget", type=float, metavar="MINUTES",
                help="stop starting new tests once this many minutes are spent; report the rest")
    g.addoption("--perf-expert-file", metavar="PATH", help="a real GGUF MoE model file for perf/offload")
    g.addoption("--perf-allow-tainted", action="store_true",
                help="gate metrics even when the preflight check found the machine busy or throttled")


class _PerfState:
    def __init__(self, config: pytest.Config):
        opt = config.getoption
        baselines_dir = Path(opt("--perf-baselines")).resolve() if opt("--perf-baselines") else None
        self.settings = load_settings(Path(config.rootpath), baselines_dir)
        if opt("--perf-retries") is not None:
            if opt("--perf-retries") < 0:
                raise ConfigError("--perf-retries must be >= 0")
            self.settings.retries = opt("--perf-retries")
        if opt("--perf-gate"):
            self.settings.gate = opt("--perf-gate")
        budget = opt("--perf-budget")
        if budget is not None and budget <= 0:
            raise ConfigError(f"--perf-budget must be a positive number of minutes, got {budget}")
        self.budget_s = budget * 60 if budget else None
        self.started = time.monotonic()
        self.strict = bool(opt("--perf-strict"))
        self.hardware_id = opt("--perf-hardware-id") or hardware.hardware_id()
        self.store = BaselineStore(self.settings.baselines)
        self.results: list[MetricResult] = []
        self.attachments: dict[str, dict] = {}
        self.skipped_by_budget: list[str] = []
        self.interrupted = False
        self.tainted: list[str] = []

    def baseline(self, test_id: str, metric: str):
        return self.store.lookup(self.hardware_id, area_of(test_id), test_id, metric)


def pytest_configure(config: pytest.Config) -> None:
    for name, doc in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {doc}")
    if config.getoption("--perf-expert-file"):
        os.environ["PERFGATE_EXPERT_FILE"] = str(Path(config.getoption("--perf-expert-file")).resolve())
    try:
        config.stash[_STATE] = _PerfState(config)
    except (ConfigError, BaselineError) as exc:
        raise pytest.UsageError(f"perfgate: {exc}") from None
    if not hasattr(config, "workerinput") and threading.current_thread() is threading.main_thread():
        # SIGTERM (CI cancel, a scheduler's kill) becomes KeyboardInterrupt: pytest then runs
        # sessionfinish, so results so far are saved and no baseline is left half-written.
        def _term(signum, frame):
            raise KeyboardInterrupt(f"perfgate: received signal {signum}")
        try:
            signal.signal(signal.SIGTERM, _term)
        except ValueError:
            pass


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    cache: dict[frozenset, list[str]] = {}
    for item in items:
        names = frozenset(m.name for m in item.iter_markers() if m.name in MARKERS)
        if names not in cache:
            cache[names] = missing_requirements(set(names))
        if cache[names]:
            item.add_marker(pytest.mark.skip(reason="; ".join(cache[names])))


def pytest_runtest_setup(item: pytest.Item) -> None:
    state = item.config.stash[_STATE]
    if state.budget_s is not None and "perf" in getattr(item, "fixturenames", ()):
        spent = time.monotonic() - state.started
        if spent > state.budget_s:
            pytest.skip(f"perf budget of {state.budget_s / 60:g} min spent ({spent / 60:.1f} min elapsed)")


@pytest.fixture
def perf(request: pytest.FixtureRequest) -> PerfRecorder:
    """Record measurements: ``perf.record(name, samples, unit=..., better=...)``."""
    return PerfRecorder(request.node.nodeid)


def _evaluate(state: _PerfState, rec: PerfRecorder, pooled: bool) -> list[MetricResult]:
    out = []
    for name, metric in rec.metrics.items():
        entry = state.baseline(rec.test_id, name)
        out.append(evaluate(rec.test_id, metric, entry, settings=state.settings, hardware_id=state.hardware_id,
                            samples=rec.pooled(name) if pooled else None, attempts=len(rec.attempts),
                            tainted=state.tainted))
    return out


def _suspect(r: MetricResult) -> bool:
    return r.gated and r.outcome in (Outcome.REGRESSION.value, Outcome.NOISY.value)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    result = yield
    rec = getattr(item, "funcargs", {}).get("perf")
    if not isinstance(rec, PerfRecorder) or not rec.metrics:
        return result
    state = item.config.stash[_STATE]
    try:
        evaluated = _evaluate(state, rec, pooled=False)
        attempt = 0
        while any(_suspect(r) for r in evaluated) and attempt < state.settings.retries:
            attempt += 1
            rec.new_attempt()
            item.runtest()  # re-measure: the same test body, a fresh set of samples
            evaluated = _evaluate(state, rec, pooled=False)
        if any(_suspect(r) for r in evaluated) and len(rec.attempts) > 1:
            evaluated = _evaluate(state, rec, pooled=True)
    except (BaselineError, ValueError) as exc:
        raise PerfRegression(f"perfgate could not compare: {exc}") from None
    item.stash[_RESULTS] = evaluated
    failing = [r for r in evaluated if r.gated and fails(Outcome(r.outcome), strict=state.strict)]
    if failing:
        software = hardware.fingerprint()["software"]
        lines = [report.regression_line(r, software) for r in failing]
        raise PerfRegression("performance regression:\n" + "\n".join(lines))
    return result



@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    rep = yield
    if call.when == "call":
        evaluated = item.stash.get(_RESULTS, None)
        rec = getattr(item, "funcargs", {}).get("perf")
        if evaluated is None and isinstance(rec, PerfRecorder) and rec.metrics:
            # The test body failed after recording: keep what it measured, marked unjudged.
            state = item.config.stash[_STATE]
            try:
                evaluated = _evaluate(state, rec, pooled=False)
            except (BaselineError, ValueError):
                evaluated = None
        if evaluated:
            rep.user_properties.append((_PROP, [r.to_dict() for r in evaluated]))
        if isinstance(rec, PerfRecorder) and rec.attachments:
            rep.user_properties.append((_ATTACH, rec.attachments))
    return rep


def _collect(config: pytest.Config, report) -> None:
    state = config.stash[_STATE]
    for key, value in report.user_properties:
        if key == _PROP:
            state.results.extend(MetricResult.from_dict(d) for d in value)
        elif key == _ATTACH:
            state.attachments[report.nodeid] = value
    if report.when == "setup" and report.skipped and state.budget_s is not None:
        reason = str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else str(report.longrepr)
        if "perf budget" in reason:
            state.skipped_by_budget.append(report.nodeid)


class _Collector:
    """Holds the config for the logreport hook (which receives only the report)."""

    def __init__(self, config: pytest.Config):
        self.config = config

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report):
        _collect(self.config, report)


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    if not hasattr(session.config, "workerinput"):
        session.config.pluginmanager.register(_Collector(session.config), "perfgate-collector")


def pytest_keyboard_interrupt(excinfo) -> None:
    # sessionfinish still runs after an interrupt; mark the run so files say it is partial.
    _INTERRUPTED.set()


_INTERRUPTED = threading.Event()


def _document(config: pytest.Config) -> dict:
    state = config.stash[_STATE]
    return results_mod.make_document(
        state.results, hardware_id=state.hardware_id, fingerprint=hardware.fingerprint(),
        commit=results_mod.git_commit(Path(config.rootpath)), attachments=state.attachments,
        interrupted=_INTERRUPTED.is_set(), skipped_by_budget=state.skipped_by_budget)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    if hasattr(config, "workerinput"):
        return
    state = config.stash[_STATE]
    if not state.results and not state.skipped_by_budget:
        return
    doc = _document(config)
    if config.getoption("--perf-save"):
        results_mod.save(Path(config.getoption("--perf-save")), doc)
    if config.getoption("--perf-history"):
        hist = Path(config.getoption("--perf-history"))
        stamp = doc["created"].replace(":", "").replace("+0000", "Z")
        results_mod.save(hist / f"{stamp}-{doc['commit'] or 'nocommit'}.json", doc)
    if config.getoption("--perf-markdown"):
        md = report.markdown(state.results, hardware_id=state.hardware_id, commit=doc["commit"],
                             current_software=doc["fingerprint"]["software"],
                             skipped_by_budget=state.skipped_by_budget)
        Path(config.getoption("--perf-markdown")).parent.mkdir(parents=True, exist_ok=True)
        Path(config.getoption("--perf-markdown")).write_text(md)
    if config.getoption("--perf-refresh"):
        if doc["interrupted"]:
            state.refresh_note = "run was interrupted: baselines NOT refreshed (re-run to completion)"
        else:
            written = []
            for area, entries in results_mod.baseline_entries(doc).items():
                written.append(state.store.write(state.hardware_id, area, entries, fingerprint=doc["fingerprint"]))
            state.refresh_note = "refreshed baselines: " + ", ".join(str(p) for p in written)


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):
        return
    state = config.stash[_STATE]
    if not state.results and not state.skipped_by_budget:
        return
    tr = terminalreporter
    tr.section("perfgate")
    title = f"perfgate: {state.hardware_id} (baselines: {state.settings.baselines})"
    tr.write(report.render_table(state.results, title, width=max(120, tr._tw.fullwidth)))
    regressions = [r for r in state.results if r.gated and r.outcome == "regression"]
    software = hardware.fingerprint()["software"]
    for r in regressions:
        tr.write_line("REGRESSION " + report.regression_line(r, software), red=True)
    new = [r for r in state.results if r.outcome == "new"]
    if new:
        tr.write_line(f"{len(new)} metric(s) have no baseline for {state.hardware_id}: record them with "
                      f"`pytest --perf-refresh ...` or `perfgate refresh RESULTS.json`")
    if state.skipped_by_budget:
        tr.write_line(f"perf budget spent: {len(state.skipped_by_budget)} test(s) not run: "
                      + ", ".join(state.skipped_by_budget))
    if getattr(state, "refresh_note", None):
        tr.write_line(state.refresh_note)
