"""perfgate.workloads.timing: the one way a region is timed, on the host's clock or the device's.

Issue 50: a region was timed six ways (the collectives' Timer, the pipeline's _Interval, the MoE step's
_Clock, the training step's window, the pytest-benchmark bridge's rounds, device_time.event_span_ms).
Each workload keeps its clock (host perf_counter or CUDA events); the clocks are read here alone.
"""
from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from perfgate.workloads import timing

PACKAGE = Path(__file__).resolve().parents[1] / "perfgate"


def test_a_host_span_is_the_wall_time_of_its_region_and_the_threads_cpu_time_beside_it():
    _, slept = timing.time_call(lambda: time.sleep(0.05))
    assert 0.05 <= slept < 0.5
    span = timing.Span(timing.HOST, thread_time=True)
    time.sleep(0.03)
    end = time.perf_counter() + 0.03
    while time.perf_counter() < end:  # 30 ms of this thread's own work
        pass
    span.close()
    assert span.seconds() >= 0.06
    assert 0.01 <= span.thread_seconds <= span.seconds()  # the sleep is wall time, not CPU time
    assert timing.Span(timing.HOST).close().thread_seconds == 0.0  # not asked: not read


def test_time_call_returns_the_calls_result_and_refuses_an_unknown_clock():
    assert timing.time_call(lambda: 42)[0] == 42
    with pytest.raises(ValueError, match="clock"):
        timing.Span("wall")


def test_now_is_the_host_clock_and_a_boundary_between_phases():
    a = timing.now()
    time.sleep(0.01)
    b = timing.now(type("CPU", (), {"type": "cpu"})())
    assert b - a >= 0.01
    assert timing.clock_of(type("GPU", (), {"type": "cuda"})()) == timing.DEVICE
    assert timing.clock_of(None) == timing.clock_of("cpu") == timing.HOST


def test_a_device_span_is_the_regions_length_on_the_gpu():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU: the device clock is two CUDA events")
    a = torch.randn(4096, 4096, device="cuda")
    a @ a
    torch.cuda.synchronize()
    t0 = timing.now("cuda")
    _, device_s = timing.time_call(lambda: [a @ a for _ in range(20)], timing.DEVICE)
    host_s = timing.now("cuda") - t0
    assert 0 < device_s <= host_s * 1.05  # the device's span lies inside the host's bracket


def _sources():
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name != "timing.py":
            yield path.relative_to(PACKAGE.parent), path.read_text()


def test_the_device_clock_is_read_in_one_place():
    """CUDA events that time a region are made in perfgate/workloads/timing.py only."""
    assert [str(p) for p, text in _sources() if re.search(r"cuda\.Event\(", text)] == []


@pytest.mark.parametrize("module", ["workloads/collectives/ops.py", "workloads/pipeline/chunk_timer.py",
                                    "workloads/pipeline/torch_pp.py", "workloads/pipeline/megatron_common.py",
                                    "workloads/moe/step.py", "workloads/training/engine.py",
                                    "workloads/device_time.py", "workloads/device_burn.py", "benchmark_bridge.py"])
def test_the_timers_that_were_six_read_the_clock_through_timing(module):
    text = (PACKAGE / module).read_text()
    regions = [line.strip() for line in text.splitlines()
               if re.search(r"(\w+) = time\.perf_counter\(\)(?! \+)", line)]  # a region's start or end
    assert regions == [], regions
    assert "timing." in text
