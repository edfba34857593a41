"""Recording shared by the DDP and FSDP tests.

Launches and their cache live elsewhere: perfgate.workloads.training measures a whole
(engine, profile, world size) job in one launch through the plugin's ``runs`` cache, so
speedups against world 1 compare two launches of this very session.
"""
from __future__ import annotations

import pytest

from perfgate.workloads.training.summary import CaseSummary


def _record_throughput(perf, s: CaseSummary) -> None:
    perf.record("tokens_per_s", s.tokens_per_s, unit="tok/s", better="higher")
    perf.record("step_ms", s.step_ms, unit="ms", better="lower")  # slowest rank per step
    if s.peak_alloc_gib:
        perf.record("peak_alloc_gib", s.peak_alloc_gib, unit="GiB", better="lower")
    if s.device_busy_fraction:  # GPU: does the step time measure the device? (workloads/device_time.py)
        perf.record("device_ms", s.device_ms, unit="ms", better="lower")
        perf.record("device_busy_fraction", s.device_busy_fraction, unit="fraction", better="higher")


def _record_tracked_memory(perf, s: CaseSummary) -> None:
    """Tracker peak per step and its breakdown (params, grads, optimizer, activations, temp, other)."""
    perf.record("tracked_peak_mib", s.tracked_peak_mib, unit="MiB", better="lower")
    for name, values in s.categories_mib.items():
        perf.record(f"{name}_at_peak_mib", values, unit="MiB", better="lower")


@pytest.fixture
def record_throughput():
    """tokens/s and slowest-rank step time per timed step; on GPUs the peak CUDA allocation, the
    device's busy time per step and its busy share (a step below 0.9 is host-bound)."""
    return _record_throughput


@pytest.fixture
def record_tracked_memory():
    return _record_tracked_memory
