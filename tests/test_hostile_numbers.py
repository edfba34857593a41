"""Issue 27, item 1: no silent pass from a number perfgate reads, whatever the file holds.

The hostile user's find: a results file whose run summaries held NaN medians, refreshed into a
baseline, made a run at 7x the baseline `pass` with change `+nan%` (every comparison with NaN is
false, so the verdict fell through to pass). Here every numeric field of a real valid baseline
document and of a real valid results document is replaced, one at a time, by NaN, +-infinity, a
huge or a tiny number, a boolean or a value of the wrong type, and the real readers, the real
gate and the real `perfgate compare` / `perfgate refresh` (through cli.main) must either stop
with one line naming the file and the key, or give a verdict that is not `pass`. The valid
documents give a regression (the current run is 7x the baseline), so a `pass` can only come from
the replaced number.
"""
from __future__ import annotations

import contextlib
import copy
import io
import json
import math
import re
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from perfgate import cli
from perfgate.judge.config import Settings
from perfgate.judge.fingerprint_check import compare as compare_fingerprints
from perfgate.judge.baseline_choice import Choice
from perfgate.judge.gate import Context, evaluate
from perfgate.judge.metrics import Metric, summarize
from perfgate.store.baselines import BaselineError, BaselineStore
from perfgate.judge.baseline_entry import BaselineEntry
from perfgate.store.results import make_document
from perfgate.judge.metric_result import MetricResult

HW = "cpu-Test-2c"
TEST = "perf/serving/test_x.py::test_decode"
METRIC = "decode_ms"
BASE_SAMPLES = [0.40, 0.41, 0.39, 0.40, 0.42, 0.38, 0.40]
CURRENT_SAMPLES = [2.83, 2.85, 2.81, 2.83, 2.84, 2.82, 2.83]  # 7x the baseline: a regression
FINGERPRINT = {
    "cpu": {"model": "Test CPU", "vendor": "AuthenticAMD", "family": 25, "model_number": 17, "stepping": 1,
            "cores": 2, "threads_per_core": 1, "numa_nodes": 1, "memory_gib": 23.5, "base_mhz": 2600.0,
            "max_mhz": 3500.0, "mhz_reported": 2596.1, "arch": "x86_64", "isa": "avx512", "isa_features": ["avx2"]},
    "gpus": [{"index": 0, "name": "NVIDIA H200", "memory_gib": 140.4, "power_limit_w": 700.0,
              "app_clock_sm_mhz": 1980, "pcie_max_gen": 5, "pcie_max_width": 16, "mig": False, "ecc": True}],
    "links": [["X"]], "hostname": "vm", "software": {"torch": "2.13.0"},
}
RUNS = [{"median": m, "spread": 0.02, "n": 7, "when": "2026-12-01T00:00:00+00:00", "commit": "abc",
         "host": {"hostname": "vm"}} for m in (0.40, 0.41, 0.39)]
HOSTILE = [math.nan, math.inf, -math.inf, 1e300, -1e300, 1.7976931348623157e308, 10**400, 5e-324, 1e-300, -1e-300,
           True, False, "1", "nan", None, [], {}, [1.0]]
# values no numeric field may hold: every reader refuses each of them (a relative change from a
# baseline median of 0 is infinite, so a saved verdict's change may be +-inf, never NaN)
REFUSED = [math.nan, math.inf, 1e300, True, "1"]  # (the properties add -inf, 10**400, lists, tiny values)
FAST = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _entry() -> BaselineEntry:
    spread = {"runs": 3, "run_medians": [0.40, 0.41, 0.39], "run_to_run": 0.02, "within_run": 0.01, "k": 3.0,
              "floor": 0.02, "proposed_tol": 0.1, "absolute": False, "when": "2026-12-01T00:00:00+00:00"}
    return BaselineEntry(unit="ms", better="lower", summary=summarize(BASE_SAMPLES), tol=0.1,
                         provenance="measured: calibrate, pooled over 3 runs", when="2026-12-01T00:00:00+00:00",
                         commit="abc", software={"torch": "2.13.0"}, spread=spread, runs=tuple(RUNS))


def _valid_baseline() -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        path = BaselineStore(Path(tmp)).write(HW, "serving", {TEST: {METRIC: _entry()}}, fingerprint=FINGERPRINT)
        return json.loads(path.read_text())


def _result(samples: list[float], *, runs: bool) -> dict:
    r = MetricResult(test_id=TEST, area="serving", metric=METRIC, unit="ms", better="lower", tol=0.1, gated=True,
                     summary=summarize(samples), attempts=1, rerun=f"pytest '{TEST}'",
                     verdict={"outcome": "pass", "change": 0.01, "tol": 0.1, "p_value": 0.5,
                              "explanation": "change +1.0% within tolerance 10.0%", "baseline_median": 0.4},
                     baseline={"median": 0.4, "mad": 0.01, "n": 7, "samples": list(BASE_SAMPLES),
                               "provenance": "measured", "run_medians": [0.40, 0.41, 0.39]})
    doc = make_document([r], hardware_id=HW, fingerprint=copy.deepcopy(FINGERPRINT), commit="abc")
    if runs:  # a results file pooled over runs carries their summaries: refresh copies them into the baseline
        doc["results"][0]["runs"] = copy.deepcopy(RUNS)
    return doc


VALID_BASELINE = _valid_baseline()
VALID_REFERENCE = _result(BASE_SAMPLES, runs=True)   # compare's A, refresh's input
VALID_CURRENT = _result(CURRENT_SAMPLES, runs=False)  # compare's B
CURRENT = Metric(name=METRIC, unit="ms", better="lower", summary=summarize(CURRENT_SAMPLES))
GATE_ALL = {"gate": "all"}  # an absolute metric on a cpu- id is gated only with gate = all


def numeric_paths(doc, prefix=()):
    """Every path to an int or float (not a boolean) in ``doc``."""
    if isinstance(doc, dict):
        items = doc.items()
    elif isinstance(doc, list):
        items = enumerate(doc)
    else:
        if isinstance(doc, (int, float)) and not isinstance(doc, bool):
            yield prefix
        return
    for k, v in items:
        yield from numeric_paths(v, prefix + (k,))


def key_of(path: tuple) -> str:
    """The key as the readers name it: ``results[0].summary.samples[3]``, ``entries['t']['m'].tol``."""
    if path[0] == "entries":
        head, rest = f"entries[{path[1]!r}][{path[2]!r}]", path[3:]
    else:
        head, rest = str(path[0]), path[1:]
    return head + "".join(f"[{k}]" if isinstance(k, int) else f".{k}" for k in rest)


def replaced(doc: dict, path: tuple, value) -> dict:
    out = copy.deepcopy(doc)
    parent = out
    for k in path[:-1]:
        parent = parent[k]
    parent[path[-1]] = copy.deepcopy(value)
    return out


def assert_names_file_and_key(message: str, path: Path, key_path: tuple) -> None:
    key = "schema version" if key_path == ("schema_version",) else key_of(key_path)
    assert "\n" not in message.strip() and str(path) in message and key in message, (key, message)


def assert_not_pass(result: MetricResult, what) -> None:
    assert result.outcome != "pass", (what, result.verdict)


def _quiet_main(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        rc = cli.main(argv)
    return rc, err.getvalue()


def _judge_against_store(root: Path, what) -> None:
    """What a live run does: the baseline file through the store, the fingerprint check, the gate."""
    store = BaselineStore(root)
    entry = store.lookup(HW, "serving", TEST, METRIC)
    assert entry is not None, what
    diff = compare_fingerprints(store.document(HW, "serving").get("fingerprint"), FINGERPRINT)
    result = evaluate(TEST, CURRENT, Choice(entry, HW, False, diff), Context.of(Settings(baselines=root, **GATE_ALL), HW))
    assert_not_pass(result, what)


BASELINE_PATHS = list(numeric_paths(VALID_BASELINE))
REFERENCE_PATHS = [("reference",) + p for p in numeric_paths(VALID_REFERENCE)]
CURRENT_PATHS = [("current",) + p for p in numeric_paths(VALID_CURRENT)]


def test_the_valid_documents_regress_and_every_numeric_field_is_covered(tmp_path):
    # the property below is only meaningful if the unreplaced documents fail the current run
    path = BaselineStore(tmp_path).path(HW, "serving")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(VALID_BASELINE))
    _judge_against_store(tmp_path, "valid baseline")
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(VALID_REFERENCE))
    b.write_text(json.dumps(VALID_CURRENT))
    assert _quiet_main(["compare", str(a), str(b), "--root", str(tmp_path), "--gate", "all"])[0] == 1
    # what the brief lists: samples, medians, run summaries, tolerances, calibration, fingerprint, verdict
    keys = {key_of(p) for p in BASELINE_PATHS}
    for key in ("schema_version", f"entries[{TEST!r}][{METRIC!r}].summary.samples[0]",
                f"entries[{TEST!r}][{METRIC!r}].summary.median", f"entries[{TEST!r}][{METRIC!r}].tol",
                f"entries[{TEST!r}][{METRIC!r}].runs[0].median", f"entries[{TEST!r}][{METRIC!r}].runs[2].spread",
                f"entries[{TEST!r}][{METRIC!r}].runs[1].n", f"entries[{TEST!r}][{METRIC!r}].spread.run_medians[1]",
                "fingerprint.cpu.cores", "fingerprint.gpus[0].memory_gib"):
        assert key in keys, key
    assert {"results[0].verdict.baseline_median", "results[0].runs[0].median", "results[0].tol",
            "results[0].summary.n"} <= {key_of(p[1:]) for p in REFERENCE_PATHS}


@pytest.mark.parametrize("which", ["baseline", "reference", "current"])
def test_every_numeric_field_is_checked_at_the_reader(tmp_path, which):
    """Exhaustive over fields x REFUSED (the properties below sample the wider HOSTILE set end to end)."""
    from perfgate.store import results as results_mod

    valid = {"baseline": VALID_BASELINE, "reference": VALID_REFERENCE, "current": VALID_CURRENT}[which]
    store = BaselineStore(tmp_path)
    path = store.path(HW, "serving") if which == "baseline" else tmp_path / f"{which}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    checked = 0
    for key_path in numeric_paths(valid):
        for value in REFUSED:
            if key_path[-2:] == ("verdict", "change") and isinstance(value, float) and math.isinf(value):
                continue
            path.write_text(json.dumps(replaced(valid, key_path, value)))
            with pytest.raises((BaselineError, results_mod.ResultsError)) as info:
                BaselineStore(tmp_path).load(HW, "serving") if which == "baseline" else results_mod.load(path)
            assert_names_file_and_key(str(info.value), path, key_path)
            checked += 1
    # every numeric field the writer puts in each document (a baseline entry of stored samples keeps no
    # summary the samples give: 45 fields), each refused value tried
    assert checked >= 40 * len(REFUSED) - 2


@FAST
@given(st.sampled_from(BASELINE_PATHS), st.sampled_from(HOSTILE))
def test_property_no_pass_from_a_hostile_number_in_a_baseline(key_path, value):
    doc = replaced(VALID_BASELINE, key_path, value)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        path = BaselineStore(root).path(HW, "serving")
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps(doc))
        try:
            _judge_against_store(root, (key_path, value))
        except BaselineError as exc:
            assert_names_file_and_key(str(exc), path, key_path)


@settings(FAST, max_examples=150)
@given(st.sampled_from(REFERENCE_PATHS + CURRENT_PATHS), st.sampled_from(HOSTILE))
def test_property_no_pass_from_a_hostile_number_in_a_results_file(side_path, value):
    side, key_path = side_path[0], side_path[1:]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        a, b, md = root / "a.json", root / "b.json", root / "summary.md"
        a.write_text(json.dumps(replaced(VALID_REFERENCE, key_path, value) if side == "reference" else VALID_REFERENCE))
        b.write_text(json.dumps(replaced(VALID_CURRENT, key_path, value) if side == "current" else VALID_CURRENT))
        hostile = a if side == "reference" else b
        rc, err = _quiet_main(["compare", str(a), str(b), "--root", tmp, "--gate", "all", "--markdown", str(md)])
        if rc == 2:
            assert_names_file_and_key(err, hostile, key_path)
        else:
            assert rc in (0, 1), (rc, err)
            rows = [line for line in md.read_text().splitlines() if f"| {METRIC} |" in line]
            assert rows and all(not row.endswith("| pass |") for row in rows), (side_path, value, rows)
        if side != "reference":
            return
        # the chain of the issue: refresh copies the file's run summaries into a baseline, then a run is judged
        rc, err = _quiet_main(["refresh", str(a), "--yes", "--root", tmp, "--baselines", str(root / "baselines")])
        if rc == 2:
            assert_names_file_and_key(err, a, key_path)
        elif rc == 0:
            _judge_against_store(root / "baselines", (side_path, value))
        else:
            assert rc == 1 and len(err.strip().splitlines()) == 1, err  # e.g. the runs disagree: not pooled


# ---------------------------------------------------------------- the reproductions of the issue


def _nan_runs_results(tmp_path: Path) -> Path:
    doc = _result([0.4] * 7, runs=False)
    doc["results"][0]["runs"] = [{"median": math.nan, "n": 7}] * 3
    path = tmp_path / "nan-runs.json"
    path.write_text(json.dumps(doc))
    return path


def test_refresh_of_nan_run_medians_is_refused_naming_file_and_key(tmp_path):
    path = _nan_runs_results(tmp_path)
    rc, err = _quiet_main(["refresh", str(path), "--yes", "--root", str(tmp_path)])
    assert rc == 2
    assert err.strip() == (f"perfgate refresh: error: {path}: results[0].runs[0].median: must be a finite number, "
                           f"got nan; results files are written by `pytest --perf-save PATH`: re-run with --perf-save")
    assert not (tmp_path / "baselines").exists()


@pytest.mark.parametrize("median", [math.nan, math.inf, -math.inf])
def test_gate_never_passes_on_non_finite_run_medians_built_in_code(tmp_path, median):
    # defence in depth: an entry that never went through a reader (built in code) is refused by the gate
    entry = BaselineEntry(unit="ms", better="lower", summary=summarize([0.4] * 7), tol=0.1, provenance="measured",
                          runs=tuple({"median": median, "n": 7} for _ in range(3)))
    with pytest.raises(ValueError, match="not a finite number"):
        evaluate(TEST, CURRENT, Choice(entry, HW, False, None), Context.of(Settings(baselines=tmp_path), HW))


def test_absurd_run_medians_are_refused_or_capped(tmp_path):
    # 1e300 is beyond any measurement, and so is 1e-300 (issue 49): the reader refuses both
    doc = copy.deepcopy(VALID_BASELINE)
    runs = doc["entries"][TEST][METRIC]["runs"]
    path = BaselineStore(tmp_path).path(HW, "serving")
    path.parent.mkdir(parents=True)
    for medians, says in (((1e-20, 1.0, 1e300), r"runs\[2\]\.median: must be a number of sane magnitude"),
                          ((1e-300, 1.0, 1.0), r"runs\[0\]\.median: 1e-300 ms is closer to zero than any real")):
        for run, m in zip(runs, medians):
            run["median"] = m
        path.write_text(json.dumps(doc))
        with pytest.raises(BaselineError, match=says):
            BaselineStore(tmp_path).load(HW, "serving")
    # within the magnitude bound, the spread of (1e-300, 1, 1e29) widened the tolerance to 445 %: now
    # the widening stops at 100 % and the verdict says so
    entry = BaselineEntry(unit="ms", better="lower", summary=summarize([1.0] * 7), tol=0.1, provenance="measured",
                          runs=tuple({"median": m, "n": 7} for m in (1e-300, 1.0, 1e29)))
    result = evaluate(TEST, CURRENT, Choice(entry, HW, False, None), Context.of(Settings(baselines=tmp_path), HW))
    assert result.tol == 1.0 and result.outcome == "regression", result.verdict
    assert "tolerance is capped at 100%" in result.verdict["explanation"]
    assert result.verdict["baseline_median"] == 1.0


# ---------------------------------------------------------------- defence in depth, at function level


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_decide_never_passes_on_a_non_finite_input(bad):
    from perfgate.judge.verdict import decide

    base, cur = [0.4] * 7, [2.83] * 7
    for kwargs in ({"baseline": base[:-1] + [bad], "current": cur}, {"baseline": base, "current": cur[:-1] + [bad]},
                   {"baseline": base, "current": cur, "baseline_median": bad},
                   {"baseline": base, "current": cur, "abs_floor": bad},
                   {"baseline": base, "current": cur, "tol": bad}):
        kwargs.setdefault("tol", 0.1)
        with pytest.raises(ValueError, match="finite"):
            decide(better="lower", **kwargs)
    with pytest.raises(ValueError, match="not a number"):
        decide([0.4] * 7, [True] * 7, better="lower", tol=0.1)


def test_decide_does_not_overflow_on_huge_finite_values():
    from perfgate.judge.verdict import decide

    v = decide([1e308, 1e308], [1.7e308, 1.7e308], better="lower", tol=0.1)
    assert v.outcome.value != "pass" and v.baseline_median == 1e308 and math.isfinite(v.change)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_run_noise_refuses_non_finite_medians(bad):
    from perfgate.judge import run_noise

    runs = [run_noise.RunSummary(median=m, spread=None, n=7) for m in (0.4, bad, 0.39)]
    for call in (lambda: run_noise.center(runs), lambda: run_noise.effective_tolerance(0.1, runs),
                 lambda: run_noise.robust_spread([0.4, bad, 0.39]), lambda: run_noise.effective_tolerance(bad, runs[:1]),
                 lambda: run_noise.RunSummary.from_dict({"median": bad})):
        with pytest.raises(ValueError, match="not a finite number"):
            call()


def test_run_noise_widening_is_capped_and_says_so():
    from perfgate.judge import run_noise

    wild = [run_noise.RunSummary(median=m, spread=None, n=7) for m in (1e-300, 1.0, 1e29)]
    assert run_noise.effective_tolerance(0.1, wild) == run_noise.MAX_NOISE_TOL == 1.0
    assert "would let almost any change pass; the tolerance is capped at 100%" in run_noise.cap_note(0.1, wild)
    assert run_noise.effective_tolerance(1.5, wild) == 1.5 and run_noise.cap_note(1.5, wild) is None  # configured wins
    calm = [run_noise.RunSummary(median=m, spread=None, n=7) for m in (0.40, 0.41, 0.39)]
    assert run_noise.cap_note(0.1, calm) is None and run_noise.effective_tolerance(0.1, calm) == pytest.approx(3 * 1.4826 * 0.01 / 0.40)
    fractions = [run_noise.RunSummary(median=m, spread=None, n=7) for m in (0.0, 0.5, 1.0)]
    assert run_noise.effective_tolerance(0.03, fractions, absolute=True) == run_noise.MAX_NOISE_TOL_ABSOLUTE


@pytest.mark.parametrize("value, says", [("nan", "non-negative finite number, got nan"),
                                         ("inf", "non-negative finite number, got inf"),
                                         ("true", "must be a number like 0.05, got True"),
                                         ("1e300", "must be at most 10 (1000%), got 1e+300"),
                                         ("-0.0001", "non-negative finite number")])
def test_tolerances_files_are_checked_at_the_reader(tmp_path, value, says):
    from perfgate.judge.config import ConfigError
    from perfgate.store.settings import load_settings

    path = tmp_path / "baselines" / "tolerances.toml"
    path.parent.mkdir()
    for table in ("[tolerances]\nlatency", "[overrides]\n\"perf/*\""):
        path.write_text(f"{table} = {value}\n")
        with pytest.raises(ConfigError) as info:
            load_settings(tmp_path, hardware_id=HW)
        assert str(path) in str(info.value) and says in str(info.value) and "\n" not in str(info.value)
    (tmp_path / "pyproject.toml").write_text(f"[tool.perfgate.tolerances]\nlatency = {value}\n")
    path.unlink()
    with pytest.raises(ConfigError, match=re.escape(says)):
        load_settings(tmp_path, hardware_id=HW)


def test_calibrate_never_proposes_a_tolerance_the_readers_refuse():
    from perfgate.commands import calibrate as cal
    from perfgate.judge.metrics import MAX_TOLERANCE

    assert cal.propose(50.0, k=3, floor=0.02) == MAX_TOLERANCE
    assert cal.propose(math.inf, k=3, floor=0.02) is None and cal.propose(math.nan, k=3, floor=0.02) is None
