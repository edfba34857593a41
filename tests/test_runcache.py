"""The plugin's run cache: one producer call per entry, and a re-measurement drops exactly the
entries the re-measured test read (unit tests here; end to end through pytester below)."""
from __future__ import annotations

import json

import pytest

from perfgate.runcache import RunCache, RunCacheError


def test_get_produces_once_and_counts():
    runs, calls = RunCache(), []
    for _ in range(3):
        assert runs.get("a", lambda: calls.append(1) or len(calls)) == 1
    assert calls == [1] and runs.produced == 1


def test_get_many_produces_the_missing_batch_in_one_call():
    runs, asked = RunCache(), []

    def produce(missing):
        asked.append(missing)
        return {k: k * 10 for k in missing}

    runs.begin("t1")
    assert runs.get_many([2], produce, batch=[1, 2, 3]) == [20]
    runs.begin("t2")
    assert runs.get_many([3, 1], produce, batch=[1, 2, 3]) == [30, 10]
    assert asked == [(2, 1, 3)]  # one call for the whole sweep
    assert runs.used_by("t1") == {2} and runs.used_by("t2") == {1, 3}


def test_invalidate_drops_only_what_the_test_read():
    runs, asked = RunCache(), []

    def produce(missing):
        asked.append(missing)
        return {k: (k, len(asked)) for k in missing}

    runs.begin("t1")
    runs.get_many([1], produce, batch=[1, 2, 3])
    runs.begin("t2")
    runs.get_many([2], produce, batch=[1, 2, 3])
    assert runs.invalidate("t2") == {2}
    assert runs.get_many([2], produce, batch=[1, 2, 3]) == [(2, 2)]  # re-measured alone
    assert runs.get_many([1, 3], produce, batch=[1, 2, 3]) == [(1, 1), (3, 1)]  # still the first launch
    assert asked == [(1, 2, 3), (2,)]


def test_producer_missing_a_key_is_an_error():
    with pytest.raises(RunCacheError, match=r"no result for \['b'\]"):
        RunCache().get_many(["a", "b"], lambda missing: {"a": 1})


def test_failed_producer_caches_nothing():
    runs = RunCache()
    with pytest.raises(ZeroDivisionError):
        runs.get("a", lambda: 1 / 0)
    assert runs.get("a", lambda: 2) == 2


SHARED = """
import os, pytest
LAUNCHES = []

def sweep(missing):
    LAUNCHES.append(missing)
    slow = os.environ.get("FLAKY") == "1" and len(LAUNCHES) == 1
    return {k: [(5.0 if slow and k == "b" else 10.0) + 0.01 * i for i in range(6)] for k in missing}

@pytest.mark.cpu
@pytest.mark.parametrize("size", ["a", "b", "c"])
def test_size(perf, runs, size):
    samples, = runs.get_many([size], sweep, batch=["a", "b", "c"])
    perf.record("bw", samples, unit="GB/s", better="higher")

def test_launches():
    print("LAUNCHES", LAUNCHES)
"""


def test_remeasurement_relaunches_only_the_retried_entry(pytester, monkeypatch):
    pytester.makepyfile(test_shared=SHARED)
    hw = "--perf-hardware-id=cpu-Test-2c"
    pytester.runpytest(hw, "--perf-refresh", "-p", "no:cacheprovider").assert_outcomes(passed=4)
    monkeypatch.setenv("FLAKY", "1")  # the first launch measures "b" at half speed
    res = pytester.runpytest(hw, "--perf-gate=all", "--perf-retries=1", "--perf-save=r.json", "-s",
                             "-p", "no:cacheprovider")
    res.assert_outcomes(passed=4)
    res.stdout.fnmatch_lines(["*LAUNCHES [[]('a', 'b', 'c'), ('b',)]*"])
    doc = json.loads((pytester.path / "r.json").read_text())
    attempts = {r["test_id"].split("[")[1]: r["attempts"] for r in doc["results"]}
    assert attempts == {"a]": 1, "b]": 2, "c]": 1}
