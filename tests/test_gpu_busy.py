"""The GPUs' busy share during a serving phase (perfgate.machine.gpu_busy) and where it goes.

No GPU here: the NVML part must give no figure and a reason, never an error; the arithmetic on
samples and the serving latency records that carry the share beside the timings are tested directly.
"""
from __future__ import annotations

import pytest

from perfgate.machine import gpu_busy
from perfgate.workloads import serving
from perfgate.workloads.serving.serving_metrics import summarize


def test_the_share_means_the_samples_inside_the_window():
    samples = [(100, 0), (200, 90), (300, 100), (400, 95), (500, 10)]
    got = gpu_busy.inside(samples, 150, 450)
    share, n = gpu_busy.pooled_share(got), len(got)
    assert n == 3 and share == pytest.approx(0.95)


def test_too_few_samples_give_no_share():
    got = gpu_busy.inside([(100, 50), (200, 50)], 0, 1000)
    assert (gpu_busy.pooled_share(got), len(got)) == (None, 2)


def test_shares_stay_in_range_whatever_nvml_reports():
    assert gpu_busy.pooled_share(gpu_busy.inside([(1, 250), (2, 250), (3, 250)], 0, 10)) == 1.0


def test_without_a_gpu_the_window_gives_no_figure_and_says_why():
    with gpu_busy.busy_window() as w:
        sum(range(1000))
    if w.fraction is None:
        assert w.reason
    else:  # a machine with a GPU and NVML: a share, in range
        assert 0.0 <= w.fraction <= 1.0


def _summary(busy):
    records = [{"error": None, "send_s": 0.0, "first_chunk_s": 0.05, "chunk_s": [0.05, 0.06, 0.07],
                "end_s": 0.07, "prompt_tokens": 8, "output_tokens": 3}]
    return summarize(records, 0.07, gpu_busy_samples=() if busy is None else (round(busy * 100),) * 3)


def test_the_latency_records_carry_the_busy_share_beside_the_timings():
    got = serving.latency_records([_summary(0.97), _summary(0.95)], "x_")
    by_name = {r.name: r for r in got}
    assert by_name["x_gpu_busy_fraction"].samples == [0.97, 0.95]
    assert by_name["x_tpot_ms"].device_busy == pytest.approx(0.96)
    assert by_name["x_ttft_ms"].device_busy == pytest.approx(0.96)


def test_off_gpu_the_latency_records_carry_no_busy_share():
    got = serving.latency_records([_summary(None)])
    assert not any(r.name.endswith("gpu_busy_fraction") for r in got)
    assert all(r.device_busy is None and r.depends is None for r in got)


def test_runs_too_short_for_a_share_pool_their_samples():
    """A GPU sweep's C=16 phase lasts ~0.2 s: one NVML sample each, no share of its own (seen on the
    7B profile, 2026-12-02). The samples of the phase's runs pooled give it one share; fewer than
    MIN_SAMPLES in all still give none, never a made-up figure."""
    def short(percents):
        records = [{"error": None, "send_s": 0.0, "first_chunk_s": 0.05, "chunk_s": [0.05, 0.06, 0.07],
                    "end_s": 0.07, "prompt_tokens": 8, "output_tokens": 3}]
        return summarize(records, 0.07, gpu_busy_samples=percents)

    got = {r.name: r for r in serving.latency_records([short((96,)), short((90,)), short((93,))], "c_")}
    assert got["c_gpu_busy_fraction"].samples == [pytest.approx(0.93)]
    assert got["c_tpot_ms"].device_busy == pytest.approx(0.93)
    too_few = serving.latency_records([short((96,)), short(())], "c_")
    assert not any(r.name.endswith("gpu_busy_fraction") for r in too_few)
    assert gpu_busy.pooled_share([50, 100, 150]) == 1.0  # NVML's odd > 100 % readings are clamped
