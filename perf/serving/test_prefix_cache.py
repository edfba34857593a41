"""Automatic prefix caching on vs off, cold then warm (seed §12.1).

Two servers of the same model and flags, one with --enable-prefix-caching and one with
--no-enable-prefix-caching. Each repetition makes fresh shared prefixes (so the cold phase
is really cold for them), then runs the same requests twice on each server: cold, then
warm. Gated, as in-run ratios per repetition: warm (and cold) request throughput on/off,
and mean TTFT on/off; plus the server's own token hit rate from /metrics. With caching off
the server must report no hits at all (checked): otherwise "off" is not off. On CPU the two servers
alternate every repetition so drift hits both; on a GPU (GPU memory) every repetition on "on", then
on "off". Workload and metrics: perfgate.workloads.serving.measurements (``prefix_workload``,
``prefix_reduce``).
"""
from __future__ import annotations

from fixtures.cases import parametrize, record
from perfgate.workloads import serving


@parametrize(serving.AREA, "prefix")
def test_prefix_cache_on_vs_off(perf, servers, case):
    record(perf, serving.AREA.run(servers, case))
