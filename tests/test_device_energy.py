"""The energy of an interval from a counter that advances in steps (perfgate.workloads.device_energy).

NVML's counter advances every ~100 ms; a synthetic counter of known power that steps every 50 ms
stands in for it here (the meter's own arithmetic is what is checked; the real counter is read on GPUs).
"""
from __future__ import annotations

import math
import time

import pytest

from perfgate.workloads.device_energy import EnergyMeter


def stepping_counter(watts: float, step_s: float):
    start = time.perf_counter()

    def read_mj() -> int:
        steps = math.floor((time.perf_counter() - start) / step_s)
        return int(steps * step_s * watts * 1000)
    return read_mj


def test_intervals_shorter_than_the_counter_step_get_their_share_of_the_energy():
    with EnergyMeter(stepping_counter(200.0, 0.05), poll_s=0.002) as meter:
        windows = []
        for _ in range(6):
            t0 = time.perf_counter()
            time.sleep(0.03)  # shorter than one step of the counter
            windows.append((t0, time.perf_counter()))
        joules = meter.joules_each(windows)
    assert joules is not None
    for (t0, t1), j in zip(windows, joules):
        assert j == pytest.approx(200.0 * (t1 - t0), rel=0.35)  # the interpolation's error: < one step
    total = sum(joules)
    assert total == pytest.approx(200.0 * sum(t1 - t0 for t0, t1 in windows), rel=0.1)


def test_an_interval_the_counter_updates_do_not_bracket_gives_nothing():
    with EnergyMeter(stepping_counter(100.0, 0.05), poll_s=0.002) as meter:
        before = time.perf_counter() - 10.0
        assert meter.joules(before, before + 1.0) is None


def test_a_counter_that_never_moves_records_nothing():
    with EnergyMeter(lambda: 12345, poll_s=0.002) as meter:
        t0 = time.perf_counter()
        time.sleep(0.01)
        assert meter.joules_each([(t0, time.perf_counter())]) is None


def test_a_counter_that_goes_backwards_voids_every_interval():
    values = iter([5000, 6000, 7000, 100, 200, 300] + [400] * 10_000)
    with EnergyMeter(lambda: next(values), poll_s=0.001) as meter:
        time.sleep(0.05)
        t = time.perf_counter()
    assert meter.error and "went backwards" in meter.error
    assert meter.joules(t - 0.04, t - 0.01) is None
