"""Long sweeps: a progress line with the time left, and --perf-budget stopping new cases.

The sweeps here are real pytest sessions (pytester) whose perf tests sleep for real; the
arithmetic of the estimate is checked separately with an explicit clock.
"""
from __future__ import annotations

import json
import re

import pytest

from perfgate.report.progress import SweepProgress, fmt_duration

HW = "--perf-hardware-id=cpu-Test-2c"

SWEEP = """
import time, pytest

@pytest.mark.cpu
@pytest.mark.parametrize("case", range({n}))
def test_case(perf, case):
    time.sleep({sleep_s})
    perf.record("ratio", [1.0, 1.01, 0.99, 1.0, 1.0], unit="x", better="higher")

def test_plain():
    pass
"""


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_eta_is_wall_time_per_finished_test_times_tests_left():
    clock = Clock()
    p = SweepProgress(clock=clock)
    p.start(40)
    assert p.eta_s is None  # nothing finished: no estimate rather than a made-up one
    for i in range(12):
        clock.t += 15.8
        p.finished(f"t{i}")
    assert p.done == 12 and p.remaining == 28
    assert p.seconds_per_test == pytest.approx(15.8)
    assert p.eta_s == pytest.approx(15.8 * 28)
    p.has_perf_tests = True
    line = p.line()
    assert line.startswith("perfgate ━━━━━━──────────────  30% 12/40 tests, 3m10s elapsed, ~7m22s left")
    assert "(15.8 s/test)" in line and "\n" not in line


def test_eta_is_capped_by_the_budget_and_lines_are_rate_limited():
    clock = Clock()
    p = SweepProgress(budget_s=60, clock=clock)
    p.start(10)
    p.has_perf_tests = True
    clock.t += 20
    p.finished("a")
    assert p.eta_s == pytest.approx(40)  # 9 tests x 20 s would be 180 s; the budget ends it at 60
    assert "budget 1m00s: 40s left" in p.text()
    assert p.due(30) is False  # first line only after 30 s
    clock.t += 15
    p.finished("b")
    assert p.due(30) is True and p.due(30) is False  # then at most one per 30 s
    clock.t += 40
    p.finished("c")
    assert "budget 1m00s: spent, skipping the rest" in p.text()
    assert p.due(0) is True
    for t in "defghij":
        p.finished(t)
    assert p.remaining == 0 and p.due(0) is False  # nothing printed once the sweep is complete
    assert fmt_duration(42) == "42s" and fmt_duration(190) == "3m10s" and fmt_duration(7500) == "2h05m"


def test_progress_lines_in_a_real_sweep(pytester):
    pytester.makepyfile(test_sweep=SWEEP.format(n=4, sleep_s=0.3))
    res = pytester.runpytest(HW, "-q", "--perf-progress=0", "-p", "no:cacheprovider")
    res.assert_outcomes(passed=5)
    lines = [ln for ln in res.stdout.lines if ln.startswith("perfgate ━") or ln.startswith("perfgate ─")]
    done = [int(re.search(r" (\d+)/5 tests", ln).group(1)) for ln in lines]
    assert done == [1, 2, 3, 4], res.stdout.str()  # one per finished test, none once all are done
    assert all(re.search(r"~\d+s left \(\d+\.\d s/test\)", ln) for ln in lines), lines
    # pytest's own result letters still read as a row: no line is glued to the dots
    assert not any(re.search(r"\.perfgate", ln) for ln in res.stdout.lines)
    # -qq silences it, and so does 'off'
    for args in (["-qq", "--perf-progress=0"], ["-q", "--perf-progress=off"]):
        quiet = pytester.runpytest(HW, *args, "-p", "no:cacheprovider")
        assert not [ln for ln in quiet.stdout.lines if ln.startswith("perfgate ━")], args


def test_no_progress_lines_for_sessions_without_perf_tests(pytester):
    pytester.makepyfile(test_plain="import time\ndef test_a():\n    time.sleep(0.2)\ndef test_b():\n    pass\n")
    res = pytester.runpytest("--perf-progress=0", "-p", "no:cacheprovider")
    res.assert_outcomes(passed=2)
    assert "perfgate ━" not in res.stdout.str() and "perfgate ─" not in res.stdout.str()


def test_budget_stops_new_cases_and_reports_them(pytester):
    # 6 cases of 1 s each against a 3 s budget: the first ones run, the rest are skipped and listed
    pytester.makepyfile(test_sweep=SWEEP.format(n=6, sleep_s=1.0))
    res = pytester.runpytest(HW, "--perf-budget=0.05", "--perf-save=r.json", "-rs", "-p", "no:cacheprovider")
    outcomes = res.parseoutcomes()
    ran, skipped = outcomes.get("passed", 0) - 1, outcomes.get("skipped", 0)  # -1: test_plain always runs
    assert ran >= 1 and skipped >= 1 and ran + skipped == 6, res.stdout.str()
    res.stdout.fnmatch_lines([f"*perf budget spent: {skipped} test(s) not run: *"])
    res.stdout.fnmatch_lines(["*perf budget of 0.05 min spent*"])
    doc = json.loads((pytester.path / "r.json").read_text())
    assert doc["skipped_by_budget"] == [f"test_sweep.py::test_case[{i}]" for i in range(ran, 6)]
    assert len(doc["results"]) == ran  # what ran is saved; nothing is recorded for what did not


def test_budget_and_progress_under_xdist(pytester):
    # xdist workers take the controller's start time and taint verdict; the controller prints
    # the only progress lines and collects the budget skips of every worker.
    pytester.makepyfile(test_sweep=SWEEP.format(n=4, sleep_s=0.1))
    res = pytester.runpytest_subprocess(HW, "-n", "2", "-q", "--perf-budget=0.001", "--perf-progress=0",
                                        "--perf-save=x.json", "-p", "no:cacheprovider")
    res.assert_outcomes(passed=1, skipped=4)
    doc = json.loads((pytester.path / "x.json").read_text())
    assert sorted(doc["skipped_by_budget"]) == [f"test_sweep.py::test_case[{i}]" for i in range(4)]
    res.stdout.fnmatch_lines(["*perf budget spent: 4 test(s) not run: *"])
    lines = [ln for ln in res.stdout.lines if ln.startswith("perfgate ━") or ln.startswith("perfgate ─")]
    assert lines and all(re.search(r" \d/5 tests", ln) for ln in lines), res.stdout.str()
