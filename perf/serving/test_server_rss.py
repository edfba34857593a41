"""The server memory budget fires on the real server (002 §0: peak RSS decided the design).

Every serving test records its server's peak RSS (``server_peak_rss_mib``, perf/serving/conftest.py)
and fails over a budget. This test proves that rule on the session's own dense server, with no
server start of its own: one short load phase under a watch, then the budget check with a budget
just under the measured peak must fail and name the peak and the phase; at the peak it passes.
"""
from __future__ import annotations

import pytest

from perfgate.workloads.area import CheckFailed
from perfgate.workloads.serving.loadgen import random_requests, run_load
from perfgate.workloads.serving.server_memory import MemoryWatch, check_budget


def test_server_rss_budget_fires(vllm_dense, server_pool):
    p = vllm_dense.profile
    reqs = random_requests(vllm_dense.token_pool, 8, p.input_len, p.output_len, seed=31)
    watch = MemoryWatch(lambda: {vllm_dense.label: vllm_dense.server.proc.pid}).start()
    try:
        spec = vllm_dense.load(reqs, max_concurrency=4)
        result = run_load(spec)
    finally:
        peaks = watch.stop()
    assert result.failed == 0, result.errors()
    peak = peaks[vllm_dense.label].rss
    # the API server, the engine core and its worker: a tree, not the leader alone
    assert peak.processes >= 2, f"the watch saw {peak.processes} process(es) of the server's tree"
    assert peak.mib > 100, f"peak RSS {peak.mib:.0f} MiB is not a vLLM server's"
    check_budget(peaks, peak.mib, "at the peak")  # not over: passes
    with pytest.raises(CheckFailed) as failed:
        check_budget(peaks, peak.mib - 1, "one MiB under the peak")
    message = str(failed.value)
    assert f"peak RSS {peak.mib:.0f} MiB" in message and "exceeds the budget" in message, message
    assert peak.phase in message and peak.phase in (spec.describe(), "between loads"), message
