"""The plugin end to end, through pytester: record, compare, fail, refresh, save, skip.

The perf tests written here record synthetic samples: this checks the harness's own
logic, which is where fakes belong.
"""
from __future__ import annotations

import json

import pytest

HW = "--perf-hardware-id=cpu-Test-2c"

SYNTHETIC = """
import os, pytest

@pytest.mark.cpu
def test_bw(perf):
    k = float(os.environ.get("BW_SCALE", "1.0"))
    perf.record("busbw_gbps", [k * x for x in (10.0, 10.1, 9.9, 10.05, 9.95, 10.02)], unit="GB/s", better="higher")

@pytest.mark.cpu
def test_ratio(perf):
    k = float(os.environ.get("RATIO_SCALE", "1.0"))
    perf.record("parallel_over_sequential", [k * x for x in (0.60, 0.61, 0.59, 0.60, 0.62)], unit="x", better="lower")
"""


@pytest.fixture
def project(pytester, monkeypatch):
    # One report width whatever runs the tests (a terminal, a log, an xdist worker): the checks
    # below read rows, not layout (tests/test_report_render.py covers each width).
    monkeypatch.setenv("COLUMNS", "200")
    pytester.makepyfile(test_synth=SYNTHETIC)
    return pytester


def refresh(project):
    res = project.runpytest(HW, "--perf-refresh", "-p", "no:cacheprovider")
    res.assert_outcomes(passed=2)
    return res


def test_missing_baseline_is_reported_new(project):
    res = project.runpytest(HW, "-p", "no:cacheprovider")
    res.assert_outcomes(passed=2)
    res.stdout.fnmatch_lines(["*test_bw*busbw_gbps*new*", "*2 metric(s) have no baseline for cpu-Test-2c*"])


def test_refresh_writes_baselines_then_unchanged_run_passes(project):
    refresh(project)
    # tests outside perf/<area>/ fall back to their folder name as area
    files = list((project.path / "baselines" / "cpu-Test-2c").glob("*.json"))
    assert files, "refresh wrote no baseline"
    doc = json.loads(files[0].read_text())
    assert doc["schema_version"] == 2 and doc["hardware_id"] == "cpu-Test-2c"
    bw = doc["entries"]["test_synth.py::test_bw"]["busbw_gbps"]
    assert len(bw["runs"]) == 1 and bw["runs"][0]["n"] == 6  # one run summary: the between-run model starts here
    assert bw["provenance"] == "measured" and bw["summary"]["n"] == 6 and bw["software"]["torch"]
    res = project.runpytest(HW, "--perf-gate=all", "-p", "no:cacheprovider")
    res.assert_outcomes(passed=2)


def test_slower_than_baseline_fails_as_regression(project, monkeypatch):
    refresh(project)
    monkeypatch.setenv("BW_SCALE", "0.7")
    res = project.runpytest(HW, "--perf-gate=all", "-p", "no:cacheprovider")
    res.assert_outcomes(passed=1, failed=1)
    res.stdout.fnmatch_lines(["perfgate: performance regression: *busbw_gbps: worse by +30.0% (tolerance 5.0%)*",
                              "*Re-run: pytest 'test_synth.py::test_bw'*"])


def test_within_tolerance_passes(project, monkeypatch):
    refresh(project)
    monkeypatch.setenv("BW_SCALE", "0.98")
    project.runpytest(HW, "--perf-gate=all", "-p", "no:cacheprovider").assert_outcomes(passed=2)


def test_absolute_metrics_are_not_gated_on_cpu_ids_by_default(project, monkeypatch):
    refresh(project)
    monkeypatch.setenv("BW_SCALE", "0.5")
    res = project.runpytest(HW, "-p", "no:cacheprovider")
    res.assert_outcomes(passed=2)
    # a recorded-only change is counted as "worse", apart from the gated verdicts, never as a regression
    res.stdout.fnmatch_lines(["perfgate: 0 regressions in 1 gated metric; 1 recorded only (not gated on cpu-*)",
                              "*gated 1: 1 pass; recorded only 1: 1 worse"])
    monkeypatch.setenv("RATIO_SCALE", "1.5")
    res = project.runpytest(HW, "-p", "no:cacheprovider")  # ratios are gated everywhere
    res.assert_outcomes(passed=1, failed=1)


def test_improvement_passes_with_refresh_hint(project, monkeypatch):
    refresh(project)
    monkeypatch.setenv("BW_SCALE", "1.5")
    res = project.runpytest(HW, "--perf-gate=all", "-p", "no:cacheprovider")
    res.assert_outcomes(passed=2)
    res.stdout.fnmatch_lines(["*busbw_gbps*improved*"])


def test_suspected_regression_is_remeasured(pytester, monkeypatch):
    # a transient slowdown: the first attempt is slow, the re-measurement normal -> pass
    pytester.makepyfile(test_flaky="""
import os, pytest
@pytest.mark.cpu
def test_once_slow(perf):
    k = 0.5 if os.environ.get("FLAKY") == "1" and perf.attempt == 1 else 1.0
    perf.record("bw", [k * x for x in (10.0, 10.1, 9.9, 10.05, 9.95)], unit="GB/s", better="higher")
""")
    pytester.runpytest(HW, "--perf-refresh", "-p", "no:cacheprovider").assert_outcomes(passed=1)
    monkeypatch.setenv("FLAKY", "1")
    res = pytester.runpytest(HW, "--perf-gate=all", "--perf-retries=1", "--perf-save=r.json",
                             "-p", "no:cacheprovider")
    res.assert_outcomes(passed=1)
    doc = json.loads((pytester.path / "r.json").read_text())
    assert doc["results"][0]["attempts"] == 2 and doc["results"][0]["verdict"]["outcome"] == "pass"
    # with no retries allowed, the same transient fails
    pytester.runpytest(HW, "--perf-gate=all", "--perf-retries=0", "-p", "no:cacheprovider").assert_outcomes(failed=1)


def test_regression_persists_across_retries_and_fails(project, monkeypatch):
    refresh(project)
    monkeypatch.setenv("BW_SCALE", "0.5")
    res = project.runpytest(HW, "--perf-gate=all", "--perf-retries=2", "--perf-save=out.json",
                            "-p", "no:cacheprovider")
    res.assert_outcomes(passed=1, failed=1)
    doc = json.loads((project.path / "out.json").read_text())
    bw = next(r for r in doc["results"] if r["metric"] == "busbw_gbps")
    assert bw["attempts"] == 3 and bw["summary"]["n"] == 18  # pooled over 3 attempts
    assert bw["verdict"]["outcome"] == "regression"


def test_save_and_markdown(project, monkeypatch):
    refresh(project)
    monkeypatch.setenv("BW_SCALE", "0.7")
    res = project.runpytest(HW, "--perf-gate=all", "--perf-save=r.json", "--perf-markdown=s.md",
                            "-p", "no:cacheprovider")
    res.assert_outcomes(passed=1, failed=1)
    doc = json.loads((project.path / "r.json").read_text())
    assert doc["kind"] == "perfgate-results" and doc["hardware_id"] == "cpu-Test-2c"
    assert {r["metric"] for r in doc["results"]} == {"busbw_gbps", "parallel_over_sequential"}
    md = (project.path / "s.md").read_text()
    assert "### Regressions" in md and "test_bw" in md and "-30.0%" in md and "regression" in md


def test_gpu_tests_skip_with_reason(pytester):
    pytester.makepyfile(test_gpu="""
import pytest
@pytest.mark.parametrize("n", [1])
@pytest.mark.__getattr__("8gpu")
def test_needs_eight(n):
    pass
@pytest.mark.megatron
def test_megatron():
    pass
""")
    res = pytester.runpytest("-m", "8gpu", "-rs", "-p", "no:cacheprovider")
    res.assert_outcomes(skipped=1, deselected=1)
    res.stdout.fnmatch_lines(["*needs 8 GPUs, this machine (*) has 0*"])


def test_unknown_marker_is_an_error(pytester):
    pytester.makepyfile(test_bad="""
import pytest
@pytest.mark.nine_gpu
def test_x():
    pass
""")
    res = pytester.runpytest("--strict-markers", "-p", "no:cacheprovider")
    assert res.ret != 0
    res.stdout.fnmatch_lines(["*'nine_gpu' not found in `markers`*"])


def test_malformed_config_is_a_usage_error(pytester):
    pytester.makepyprojecttoml('[tool.perfgate.tolerances]\nlatency = "fast"\n')
    pytester.makepyfile(test_x="def test_x():\n    pass\n")
    res = pytester.runpytest("-p", "no:cacheprovider")
    assert res.ret == pytest.ExitCode.USAGE_ERROR
    res.stderr.fnmatch_lines(["*perfgate:*pyproject.toml*latency*must be a number*"])


def test_works_under_xdist(project):
    res = project.runpytest_subprocess(HW, "-n", "2", "--perf-refresh", "--perf-save=x.json", "-p", "no:cacheprovider")
    res.assert_outcomes(passed=2)
    doc = json.loads((project.path / "x.json").read_text())
    assert len(doc["results"]) == 2
    assert list((project.path / "baselines" / "cpu-Test-2c").glob("*.json"))
