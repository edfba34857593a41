"""The server memory budget fires on the real server (002 §0: peak RSS decided the design).

Every serving test records its server's peak RSS (``server_peak_rss_mib``, perf/serving/conftest.py)
and fails over a budget. This test proves that rule on the session's own dense server, with no
server start of its own: one short load phase under a watch, then the budget check with a budget
just under the measured peak must fail and name the peak and the phase; at the peak it passes.
A check of the rule, with nothing to record (perfgate.workloads.serving.measurements ``rss_reduce``).
"""
from __future__ import annotations

from fixtures.cases import parametrize
from perfgate.workloads import serving


@parametrize(serving.AREA, "rss")
def test_server_rss_budget_fires(servers, case):
    serving.AREA.run(servers, case)
