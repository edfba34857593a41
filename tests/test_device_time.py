"""Device time of a GPU step (perfgate.workloads.device_time): the arithmetic, and the probe tool run for real.

The profiler part needs a GPU (it ran on 1xH200, results-store/1xH200/training-2026-12-02-*); here the
union of kernel intervals and the busy share are checked directly, and tools/device_bound_probe.py
runs the real DDP engine on gloo (no device time there: the table says so)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from perfgate.workloads.device_time import DEVICE_BOUND, DeviceWindow, union_ms

ROOT = Path(__file__).resolve().parents[1]


def test_overlapping_streams_count_once():
    # a compute kernel 0-100 us, an NCCL kernel 50-150 us beside it, a copy 200-250 us
    assert union_ms([(0, 100), (50, 150), (200, 250)]) == pytest.approx(0.2)


def test_nested_touching_and_empty_intervals():
    assert union_ms([(0, 100), (10, 20), (100, 130), (5, 5)]) == pytest.approx(0.13)
    assert union_ms([]) == 0.0


def test_busy_share_is_at_most_one_and_zero_without_a_span():
    share = DeviceWindow(span_ms=10.0, busy_ms=9.5).fraction
    assert share == pytest.approx(0.95) and share >= DEVICE_BOUND
    assert DeviceWindow(span_ms=10.0, busy_ms=10.02).fraction == 1.0  # two clocks, microseconds apart
    assert DeviceWindow(span_ms=0.0, busy_ms=1.0).fraction == 0.0


def test_the_probe_tool_runs_the_real_engine():
    out = subprocess.run([sys.executable, str(ROOT / "tools" / "device_bound_probe.py"), "--backend", "gloo",
                          "--model", "gpt-tiny", "--micro-batches", "1,2", "--steps", "5"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr
    rows = [line.split() for line in out.stdout.splitlines() if line.startswith("mb")]
    assert [r[0] for r in rows] == ["mb1", "mb2"] and all(float(r[1]) > 0 for r in rows)
    assert all(r[3] == "-" and r[4] == "-" for r in rows)  # no device: no device time, said as such
